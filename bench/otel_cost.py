"""What span export costs the event loop: the time of `Telemetry.turn()` (build one turn's span tree from its trace
and queue it) per finished turn, with export off, to a receiver that answers, and to one that never answers; and
how many spans each case exported, dropped or failed. The voice path pays only this call (docs/observability.md).

Run:  .venv/bin/python -m bench.otel_cost [--turns 1000] [--every-ms 5] [--markdown] [--tiny]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from typing import Any

from bench import _stats
from bench._otlp import OtlpReceiver
from parley.config import ObservabilityConfig
from voice.trace import TurnTrace
from web.otel.export import Telemetry
from web.otel.spans import LlmFacts

MARKS = ("speech_start", "speech_end", "endpoint", "asr_final", "llm_start", "llm_first_token", "first_phrase",
         "tts_first_audio", "first_audio_sent", "playback_start", "done")  # fmt: skip


def a_turn(turn_id: int) -> TurnTrace:
    """A complete voice turn's trace, shaped like a real one (protocol.md's example)."""
    t = TurnTrace(turn_id, "bench", {"voice_to_voice": 900.0})
    t0 = time.perf_counter_ns()
    for i, m in enumerate(MARKS):
        t.mark(m, t0 + i * 50_000_000)
    t.info.update(input="voice", persona="assistant", voice="joe",
                  turn={"end": "complete", "checks": [{"silence_ms": 192.0, "audio_prob": 0.98, "text_prob": 0.75,
                                                       "complete_prob": 0.98, "wait_ms": 160, "cost_ms": 64.8,
                                                       "decision": "end"}]},
                  ahead={"asr_ms": 77.3, "prefill_ms": 63.7, "saved_ms": 141.0},
                  llm={"finish": "stop", "prefill_tokens": 1, "reused_tokens": 158, "decode_tokens": 19, "queue_ms": 0.1,
                       "generate_ms": 412.6, "shared_prefix_tokens": 0},
                  queue_ms={"asr": 0.2, "turn": 0.1, "tts": 0.3})  # fmt: skip
    return t


def _serve(hang: bool, urls: Any, stop: Any) -> None:
    receiver = OtlpReceiver(hang=hang)
    urls.put(receiver.url)
    stop.wait()
    receiver.close()


def measure(mode: str, turns: int, every_s: float) -> list[object]:
    """One case: `turns` finished turns, one every `every_s` (a busy server ends a few turns a second, not
    thousands), the receiver in a process of its own as a collector would be."""
    ctx = mp.get_context("spawn")
    stop, urls = ctx.Event(), ctx.Queue()
    receiver = None if mode == "off" else ctx.Process(target=_serve, args=(mode == "hang", urls, stop), daemon=True)
    if receiver is not None:
        receiver.start()
    url = urls.get(timeout=60) if receiver is not None else None
    cfg = ObservabilityConfig(otlp_endpoint=url, schedule_delay_ms=100, export_timeout_s=2)
    tel = Telemetry(cfg, LlmFacts("SmolLM2-135M-Instruct", "parley"), env={})
    traces = [a_turn(i) for i in range(turns)]
    tel.session_opened("bench")
    costs_us = []
    for t in traces:
        t0 = time.perf_counter_ns()
        tel.turn(t)
        costs_us.append((time.perf_counter_ns() - t0) / 1000)
        time.sleep(every_s)
    tel.session_closed("bench")
    tel.shutdown()  # sends what waits (given up on after one export timeout): the counts are final
    c = tel.counts
    counts = (c.exported, c.dropped, c.failed)
    stop.set()
    if receiver is not None:
        receiver.join(timeout=30)
    costs_us.sort()
    p99 = costs_us[min(len(costs_us) - 1, int(0.99 * len(costs_us)))]
    return [mode, turns, f"{statistics.median(costs_us):.1f}", f"{p99:.1f}", f"{costs_us[-1]:.0f}", *counts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=1000, help="finished turns per case (default 1000)")
    p.add_argument("--every-ms", type=float, default=5.0, help="time between turns (default 5: 200 turns a second)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--tiny", action="store_true", help="50 turns: a smoke test")
    args = p.parse_args(argv)
    turns = 50 if args.tiny else args.turns
    rows = [measure(mode, turns, args.every_ms / 1000) for mode in ("off", "receiver", "hang")]
    header = ["export", "turns", "median us/turn", "p99 us/turn", "max us", "spans exported", "dropped", "failed"]
    print((_stats.markdown if args.markdown else _stats.table)(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
