"""Single-key commands from a terminal (space talk/stop, p persona, i interrupt, q quit).

Puts a tty into cbreak mode for the client's lifetime and restores it; does nothing without a tty.
Knows key bindings only, not what the commands do.
"""
from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def key_reader(loop: asyncio.AbstractEventLoop, on_key: Callable[[str], None]) -> Iterator[bool]:
    """Calls on_key(char) for each key pressed; yields whether keys are being read."""
    if not sys.stdin.isatty():
        yield False
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    loop.add_reader(fd, lambda: on_key(sys.stdin.read(1)))
    try:
        yield True
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
