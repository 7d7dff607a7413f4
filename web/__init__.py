"""Parley edge: FastAPI app, wire protocol, config loading, model locator, CLI and clients."""
