"""The engine beside the other stages on the same cores: its batched decode step, and how many Whisper finals and
Piper syntheses run beside it, with the engine's team at each size (`Engine.share_cores`).

On a 2-core machine a Whisper final (two threads) beside the engine's two-thread team leaves four threads on two
cores: each step's barriers wait for whichever team thread is descheduled. This measures what a team of fewer
threads costs the engine and gives back to the stages (parley.thread_budget.ThreadBudget.engine_team).

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.contention
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

from bench import corpus
from bench.stages import table
from llm_engine.request import ChatMessage, FinishEvent, GenerateRequest, SamplingParams
from parley.config import load_config
from parley.runtime import load_and_warm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4, help="batches of three 40-token replies per cell (default 4)")
    args = p.parse_args()

    rt = load_and_warm(load_config(None))
    engine, asr = rt.engine, rt.stages.transcriber
    tts = next(iter(rt.stages.voices.values())).tts
    clip = corpus.speak(corpus.REQUESTS[3])
    stop = threading.Event()
    done = {"asr": 0, "tts": 0}

    def finals() -> None:
        while not stop.is_set():
            asr.transcribe(clip)
            done["asr"] += 1

    def speech() -> None:
        while not stop.is_set():
            list(tts.synthesize("Sure, I can help with that. It will be sunny this afternoon."))
            done["tts"] += 1

    def replies() -> tuple[float, float]:
        """Three replies at once -> (ms until all are done, median ms per decode step)."""
        reqs = [GenerateRequest(f"contention-{i}-{time.monotonic_ns()}", (ChatMessage("user", corpus.REQUESTS[i]),),
                                SamplingParams(max_new_tokens=40, temperature=0.0)) for i in range(3)]  # fmt: skip
        t0 = time.perf_counter()
        finishes = [s.collect()[2] for s in [engine.submit(r) for r in reqs]]
        wall = 1000 * (time.perf_counter() - t0)
        steps = [f.timings.decode_ms / max(1, f.timings.decode_tokens) for f in finishes if isinstance(f, FinishEvent)]
        for r in reqs:
            engine.release(r.session_id)
        return wall, statistics.median(steps)

    rows = []
    cores = rt.threads.engine if rt.threads else 1
    for label, workers in (("nothing", []), ("a Whisper final", [finals]), ("a final and Piper", [finals, speech])):
        stop.clear()
        threads = [threading.Thread(target=w, daemon=True) for w in workers]
        for t in threads:
            t.start()
        for team in sorted({cores, 1}, reverse=True) * 2:  # alternating, twice
            engine.share_cores(lambda team=team: team)
            done.update(asr=0, tts=0)
            t0 = time.perf_counter()
            walls, steps = zip(*[replies() for _ in range(args.rounds)])
            elapsed = time.perf_counter() - t0
            rows.append([label, team, statistics.median(walls), statistics.median(steps),
                         done["asr"] / elapsed, done["tts"] / elapsed])  # fmt: skip
        stop.set()
        for t in threads:
            t.join()
    rt.close()
    table(f"The engine beside other stages on {cores} cores (three 40-token replies at once; finals of a "
          f"{len(clip) / 16000:.1f} s request; syntheses of two sentences)",
          ["beside the engine", "engine threads", "replies ms", "ms per step", "finals/s beside", "syntheses/s beside"],
          rows)  # fmt: skip


if __name__ == "__main__":
    main()
