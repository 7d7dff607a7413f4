"""How many intra-op threads a recognition and a synthesis should get (parley.thread_budget): Whisper finals over
the corpus one at a time, on 6 s requests, beside a Smart Turn check and two at once, and Piper first phrases, each
with 1 and 2 threads, on this machine.

Prints tables; asserts nothing. Run: HF_HUB_OFFLINE=1 .venv/bin/python -m bench.stage_threads [--tiny]
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

from bench import corpus
from bench.stages import table
from parley.locate import find_embedded
from voice.asr import WhisperTranscriber
from voice.smart_turn import SmartTurn, with_silence_to_come
from voice.tts import PiperTts

FIRST_PHRASES = ("The weather's looking pretty good today.", "Set a timer for ten minutes.",
                 "I'll call you tomorrow morning.", "It takes eleven minutes to boil", "The capital of France is Paris.",
                 "To make a cup of green tea,", "I'll turn off the lights", "The best book to read is")  # fmt: skip


def _ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return 1000.0 * (time.perf_counter() - t0)


def _at_once(fns: list[Callable[[], object]]) -> float:
    """Wall ms until every one of `fns`, each on a thread of its own, is done."""
    threads = [threading.Thread(target=f) for f in fns]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 1000.0 * (time.perf_counter() - t0)


def _p50_p90(xs: list[float]) -> list[object]:
    xs = sorted(xs)
    return [statistics.median(xs), xs[min(len(xs) - 1, int(0.9 * len(xs)))]]


def bench_asr(clips: list[np.ndarray], rounds: int) -> None:
    turn = SmartTurn(find_embedded("turn"))
    longs = [np.concatenate(clips[i : i + 3]) for i in range(0, len(clips) - 2, 3)] or [np.concatenate(clips)]
    rows = []
    for threads in (1, 2):
        asr = WhisperTranscriber(find_embedded("asr"), cpu_threads=threads)
        asr.transcribe(clips[0])
        turn.complete_prob(clips[0])  # warm-ups: first calls allocate
        one = [_ms(lambda c=c: asr.transcribe(c)) for _ in range(rounds) for c in clips]
        six = [_ms(lambda c=c: asr.transcribe(c)) for _ in range(rounds) for c in longs]
        beside = []
        for c in clips:
            check = threading.Thread(target=turn.complete_prob, args=(with_silence_to_come(c, 32, 160),))
            check.start()
            beside.append(_ms(lambda c=c: asr.transcribe(c)))
            check.join()
        pairs = [_at_once([lambda a=a: asr.transcribe(a), lambda b=b: asr.transcribe(b)])
                 for a, b in zip(clips[::2], clips[1::2])]  # fmt: skip
        rows.append([threads, *_p50_p90(one), *_p50_p90(six), *_p50_p90(beside), *_p50_p90(pairs)])
    table(f"Whisper tiny.en finals (fitted window), ms: {len(clips)} requests, {len(longs)} of ~6 s",
          ["threads", "one p50", "one p90", "6 s p50", "6 s p90", "beside a turn check p50", "p90",
           "two at once (both) p50", "p90"], rows)  # fmt: skip


def bench_tts(rounds: int) -> None:
    rows = []
    for threads in (1, 2):
        tts = PiperTts(find_embedded("tts"), threads=threads)
        list(tts.synthesize("Hello there."))  # warm-up
        xs = [_ms(lambda p=p: list(tts.synthesize(p))) for _ in range(rounds) for p in FIRST_PHRASES]
        rows.append([threads, *_p50_p90(xs)])
    table(f"Piper (joe) first phrases of 4-8 words, ms: {len(FIRST_PHRASES)} x {rounds}", ["threads", "p50", "p90"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiny", action="store_true", help="four requests, one round (a smoke test)")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} (1 min) - numbers are only comparable at low load")
    texts = corpus.REQUESTS[:4] if args.tiny else corpus.REQUESTS[:16]
    clips = [corpus.to_16k(*(corpus.speak_piper(t) if i % 2 == 0 else corpus.speak_flite(t))) for i, t in enumerate(texts)]
    rounds = 1 if args.tiny else 2
    bench_asr(clips, rounds)
    bench_tts(rounds)


if __name__ == "__main__":
    main()
