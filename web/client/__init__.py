"""Desktop client cores: audio I/O, playback jitter buffer, echo handling, connection, terminal view.

The entry point is web/desktop.py; nothing here parses flags or reads the environment.
"""
