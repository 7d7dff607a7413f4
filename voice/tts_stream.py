"""A TTS generator run in a worker thread, its chunks as an async iterator on the event loop.

The worker is a thread of its own, or with `runner` a job of the shared-stage scheduler (voice.scheduler) at
`priority`: a reply's first phrase before its later ones, both before partial transcripts. Leaving the
iteration early sets `stop`, which the worker checks between chunks before closing the generator (or takes the
job out of the queue); an error in the worker is re-raised in the loop. Used by a reply (voice.reply) and by
/v1/audio/speech.
"""
from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import AsyncIterator
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from voice.scheduler import StageRunner
from voice.stage_queue import Priority
from voice.tts import Tts

_END = object()


async def synthesize_async(
    tts: Tts, text: str, *, rate: float = 1.0, voice: str | None = None,
    work: AbstractContextManager[object] | None = None, name: str = "tts",
    runner: StageRunner | None = None, priority: Priority = Priority.WAITED, key: str = "",
    on_wait: Callable[[float], None] = lambda ms: None,
) -> AsyncIterator[np.ndarray]:  # fmt: skip
    """float32 chunks at `tts.sample_rate`; `work` is entered by the worker while it synthesizes (a counter);
    `on_wait(ms)`: how long the job waited for a scheduler worker, once it starts."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[object] = asyncio.Queue()
    stop = threading.Event()

    def put(item: object) -> None:
        try:
            loop.call_soon_threadsafe(chunks.put_nowait, item)
        except RuntimeError:  # the loop closed under us: nobody is listening
            pass

    def run() -> None:
        with work if work is not None else nullcontext():
            gen = tts.synthesize(text, rate=rate, voice=voice)
            try:
                for chunk in gen:
                    if stop.is_set():
                        break
                    put(chunk)
            except Exception as exc:  # noqa: BLE001 - handed to the loop and re-raised there
                put(exc)
            finally:
                gen.close()
                put(_END)

    job: asyncio.Future[object] | None = None
    if runner is None:
        threading.Thread(target=contextvars.copy_context().run, args=(run,), name=name, daemon=True).start()
    else:

        def started() -> None:  # on the worker, before the synthesis
            waited_ms = 1000.0 * (time.monotonic() - queued)
            try:
                loop.call_soon_threadsafe(on_wait, waited_ms)
            except RuntimeError:  # the loop closed under us
                pass
            run()

        queued = time.monotonic()
        job = asyncio.ensure_future(runner.run("tts", priority, key, started))
        job.add_done_callback(_failed_to(put))
    try:
        while (item := await chunks.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            assert isinstance(item, np.ndarray)
            yield item
    finally:
        stop.set()
        if job is not None and not job.done():
            job.cancel()  # still queued: taken out; running: it sees `stop` at its next chunk


def _failed_to(put: Callable[[object], None]) -> Callable[[asyncio.Future[object]], None]:
    """A scheduler job that ended without running `run` (closed scheduler): the reader hears the error and the end."""

    def done(job: asyncio.Future[object]) -> None:
        if not job.cancelled() and job.exception() is not None:
            put(job.exception())
            put(_END)

    return done
