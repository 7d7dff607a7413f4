"""A TTS generator run in a worker thread, its chunks as an async iterator on the event loop.

Leaving the iteration early sets `stop`, which the worker checks between chunks before closing the generator;
an error in the worker is re-raised in the loop. Used by a reply (voice.reply) and by /v1/audio/speech.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from voice.tts import Tts

_END = object()


async def synthesize_async(
    tts: Tts, text: str, *, rate: float = 1.0, voice: str | None = None,
    work: AbstractContextManager[object] | None = None, name: str = "tts",
) -> AsyncIterator[np.ndarray]:  # fmt: skip
    """float32 chunks at `tts.sample_rate`; `work` is entered by the worker while it synthesizes (a counter)."""
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

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        while (item := await chunks.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            assert isinstance(item, np.ndarray)
            yield item
    finally:
        stop.set()
