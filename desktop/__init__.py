"""The desktop client (`parley client`): audio I/O, playback jitter buffer, echo handling, connection, terminal view.

The entry point is desktop/main.py; nothing else here parses flags or reads the environment.
"""
