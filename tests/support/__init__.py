"""Helpers the suites share (tests/ is on sys.path under pytest): waiting for a condition, and more as they are
shared."""
