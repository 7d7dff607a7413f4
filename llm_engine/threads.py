"""Run a function on a thread of its own that exits before the call returns.

torch keeps one OpenMP thread pool per thread that ran a parallel op, and while two pools live libgomp
throttles every pool's spin-waits: measured on the 2-core CPU, the engine thread then decoded ~40 % slower
(int4: 38 vs 23 ms/token). A finished thread's pool is freed, so loading models (or measuring) this way
leaves the engine thread's pool the only one. It knows nothing about models or engines.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def on_own_thread(fn: Callable[..., T], *args: object, name: str = "parley-once") -> T:
    """fn(*args) on a fresh thread, joined: -> its result, or its exception re-raised on the caller's thread."""
    done: dict[str, Any] = {}

    def work() -> None:
        try:
            done["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            done["error"] = exc

    thread = threading.Thread(target=work, name=name)
    thread.start()
    thread.join()
    if "error" in done:
        raise done["error"]
    return done["value"]
