"""Server-wide counters for /metrics (Prometheus text exposition 0.0.4), /api/traces and the trace log.

Written by hand (a few counters and histograms do not need a client library). Knows traces as dicts only.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from parley.config import TRACE_STAGES

log = logging.getLogger(__name__)

BUCKETS_MS = (25, 50, 100, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000)


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_MS) + 1)  # last: +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(BUCKETS_MS):
            if value <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += value
        self.count += 1


def stage_counters(llm: Any) -> dict[str, tuple[float, str]]:
    """The LLM stage's own counters: the prefix cache across sessions (0 for a remote LLM)."""
    hits, tokens = llm.prefix_cache_counts() if llm is not None else (0, 0)  # (0, 0) from a remote LLM
    return {
        "parley_llm_prefix_cache_hits_total": (hits, "Requests that copied their prompt's first tokens from another session's KV cache."),
        "parley_llm_prefix_cache_tokens_total": (tokens, "Prompt tokens those copies saved computing."),
    }


def busy_counters(runtime: Any) -> dict[str, tuple[float, str]]:
    """Where the server's time goes, per stage (seconds of engine steps, of shared-worker jobs by stage), and how
    often a greeting's audio was synthesised or replayed."""
    out: dict[str, tuple[float, str]] = {
        "parley_llm_busy_seconds_total": (round(runtime.stages.llm.busy_seconds()[0], 3), "Seconds of engine steps."),
    }
    stage_busy = dict(runtime.stages.runner.stage_busy_s)
    for stage in ("asr", "tts", "turn"):
        out[f"parley_{stage}_busy_seconds_total"] = (round(stage_busy.get(stage, 0.0), 3), f"Worker seconds of {stage} jobs.")
    phrases = runtime.stages.phrase_audio
    out["parley_greeting_audio_synthesised_total"] = (phrases.stored, "Greeting phrases synthesised (then kept).")
    out["parley_greeting_audio_reused_total"] = (phrases.hits, "Greeting phrases replayed from the kept audio.")
    return out


class Metrics:
    def __init__(self, trace_log: str | Path | None = None, keep_traces: int = 200) -> None:
        self._lock = threading.Lock()
        self.trace_log = Path(trace_log) if trace_log else None
        self.turns: Counter[str] = Counter()  # outcome -> count
        self.errors: Counter[str] = Counter()  # code -> count
        self.over_budget: Counter[str] = Counter()  # stage -> count
        self.stages = {stage: Histogram() for stage in TRACE_STAGES}
        self.active_sessions = 0
        self.sessions_total = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep_traces)
        self._v2v: deque[tuple[float, float]] = deque(maxlen=500)  # (monotonic s, voice_to_voice ms) of recent turns
        self.preemptive: Counter[str] = Counter()  # hit | miss | shed | dropped -> voice turns (voice/first_phrase.py)
        self.preemptive_waste: Counter[str] = Counter()  # tokens, tts_ms: preemptive work thrown away

    def session_opened(self) -> None:
        with self._lock:
            self.active_sessions += 1
            self.sessions_total += 1

    def session_closed(self) -> None:
        with self._lock:
            self.active_sessions -= 1

    def error(self, code: str) -> None:
        with self._lock:
            self.errors[code] += 1

    def record_trace(self, trace: dict[str, Any]) -> None:
        """A finished turn: counters, histograms, recent list, and one JSON line in the trace log."""
        with self._lock:
            outcome = "interrupted" if "interrupted" in trace["marks_ms"] else "no_words" if trace.get("no_words") else "done"
            self.turns[outcome] += 1
            for stage, value in trace["stages_ms"].items():
                if stage in self.stages:
                    self.stages[stage].observe(float(value))
            for stage in trace["over_budget"]:
                self.over_budget[stage] += 1
            self.recent.append(trace)
            if "preemptive" in trace:
                self.preemptive[str(trace["preemptive"])] += 1
                waste = trace.get("preemptive_waste") or {}
                self.preemptive_waste["tokens"] += int(waste.get("tokens", 0))
                self.preemptive_waste["tts_ms"] += float(waste.get("tts_ms", 0.0))
            if "voice_to_voice" in trace["stages_ms"]:
                self._v2v.append((time.monotonic(), float(trace["stages_ms"]["voice_to_voice"])))
        if trace["over_budget"]:
            log.info("turn %s over budget: %s", trace["turn_id"], ", ".join(trace["over_budget"]))
        if self.trace_log is not None:
            try:
                with self.trace_log.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(trace, separators=(",", ":")) + "\n")
            except OSError as exc:  # a full disk must not end the conversation; the trace is still in /metrics
                log.warning("cannot append to trace log %s: %s", self.trace_log, exc)

    def forget_recent(self) -> None:
        with self._lock:
            self._v2v.clear()

    def recent_v2v_p95(self, window_s: float = 30.0, min_turns: int = 4) -> float | None:
        """p95 voice-to-voice of the turns that finished in the last `window_s`; None with fewer than `min_turns`."""
        now = time.monotonic()
        with self._lock:
            values = sorted(v for t, v in self._v2v if now - t <= window_s)
        if len(values) < min_turns:
            return None
        return values[min(len(values) - 1, int(0.95 * len(values)))]

    def traces(self, limit: int = 50) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.recent)[-limit:]

    def render(self, extra_gauges: dict[str, float] | None = None, extra_counters: dict[str, tuple[float, str]] | None = None) -> str:
        """The exposition; extra_gauges and extra_counters ({name: (value, help)}) come from the loaded stages."""
        lines: list[str] = []

        def head(name: str, kind: str, help_text: str) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")

        with self._lock:
            head("parley_turns_total", "counter", "Finished user turns by outcome.")
            for outcome in ("done", "interrupted", "no_words"):  # no_words: a turn heard as no words, not answered
                lines.append(f'parley_turns_total{{outcome="{outcome}"}} {self.turns[outcome]}')
            head("parley_stage_latency_ms", "histogram", "Per-turn stage latency in milliseconds (docs/protocol.md, Turn trace).")
            for stage, h in self.stages.items():
                cumulative = 0
                for bound, n in zip(BUCKETS_MS, h.counts):
                    cumulative += n
                    lines.append(f'parley_stage_latency_ms_bucket{{stage="{stage}",le="{bound}"}} {cumulative}')
                lines.append(f'parley_stage_latency_ms_bucket{{stage="{stage}",le="+Inf"}} {h.count}')
                lines.append(f'parley_stage_latency_ms_sum{{stage="{stage}"}} {h.sum:.3f}')
                lines.append(f'parley_stage_latency_ms_count{{stage="{stage}"}} {h.count}')
            head("parley_over_budget_total", "counter", "Turns whose stage went over its budget.")
            for stage in TRACE_STAGES:
                lines.append(f'parley_over_budget_total{{stage="{stage}"}} {self.over_budget[stage]}')
            head("parley_active_sessions", "gauge", "Open WebSocket sessions.")
            lines.append(f"parley_active_sessions {self.active_sessions}")
            head("parley_sessions_total", "counter", "Sessions started since the server started.")
            lines.append(f"parley_sessions_total {self.sessions_total}")
            head("parley_preemptive_total", "counter", "Voice turns by whether the reply's first phrase, made in the "
                 "pause, was ready at the endpoint (hit), not yet (miss), skipped for load (shed) or thrown away (dropped).")
            for outcome in ("hit", "miss", "shed", "dropped"):
                lines.append(f'parley_preemptive_total{{outcome="{outcome}"}} {self.preemptive[outcome]}')
            head("parley_preemptive_wasted_tokens_total", "counter", "Reply tokens decoded in a pause and thrown away.")
            lines.append(f"parley_preemptive_wasted_tokens_total {int(self.preemptive_waste['tokens'])}")
            head("parley_preemptive_wasted_tts_ms_total", "counter", "Synthesis milliseconds spent in a pause and thrown away.")
            lines.append(f"parley_preemptive_wasted_tts_ms_total {self.preemptive_waste['tts_ms']:.3f}")
            head("parley_errors_total", "counter", "Error messages sent to clients, by code.")
            for code in sorted(self.errors):
                lines.append(f'parley_errors_total{{code="{code}"}} {self.errors[code]}')
        for name, (count, help_text) in (extra_counters or {}).items():
            head(name, "counter", help_text)
            lines.append(f"{name} {count}")
        for name, value in (extra_gauges or {}).items():
            head(name, "gauge", name.replace("_", " ") + ".")
            lines.append(f"{name} {value}")
        return "\n".join(lines) + "\n"


def scheduler_exposition(stats: Any) -> str:
    """The shared-stage scheduler's queue (voice.scheduler.WaitStats): waits by stage and priority, depth now,
    partials skipped, finals batched. "" under `server.scheduling: direct` (nothing queues there)."""
    if stats is None:
        return ""
    from voice.scheduler import WAIT_BUCKETS_MS

    lines = [
        "# HELP parley_stage_queue_wait_ms Time a recognition, synthesis or turn check waited for a shared worker.",
        "# TYPE parley_stage_queue_wait_ms histogram",
    ]
    for (stage, priority), counts in sorted(stats.buckets.items()):
        labels = f'stage="{stage}",priority="{priority}"'
        cumulative = 0
        for bound, n in zip(WAIT_BUCKETS_MS, counts):
            cumulative += n
            lines.append(f'parley_stage_queue_wait_ms_bucket{{{labels},le="{bound}"}} {cumulative}')
        lines.append(f'parley_stage_queue_wait_ms_bucket{{{labels},le="+Inf"}} {stats.count[(stage, priority)]}')
        lines.append(f"parley_stage_queue_wait_ms_sum{{{labels}}} {stats.wait_sum_ms[(stage, priority)]:.3f}")
        lines.append(f"parley_stage_queue_wait_ms_count{{{labels}}} {stats.count[(stage, priority)]}")
    lines += ["# HELP parley_stage_queue_depth Jobs waiting for a shared worker, by priority.", "# TYPE parley_stage_queue_depth gauge"]
    for priority, n in sorted(stats.depth.items()):
        lines.append(f'parley_stage_queue_depth{{priority="{priority}"}} {n}')
    lines += ["# HELP parley_stage_jobs_running Jobs on the shared workers now.", "# TYPE parley_stage_jobs_running gauge",
              f"parley_stage_jobs_running {stats.running}"]  # fmt: skip
    lines += ["# HELP parley_stage_skipped_total Partial transcripts dropped because the machine was behind.",
              "# TYPE parley_stage_skipped_total counter"]  # fmt: skip
    for (stage, reason), n in sorted(stats.skipped.items()):
        lines.append(f'parley_stage_skipped_total{{stage="{stage}",reason="{reason}"}} {n}')
    lines += ["# HELP parley_stage_batched_total Jobs that ran in a batch of two or more (several sessions' finals).",
              "# TYPE parley_stage_batched_total counter"]  # fmt: skip
    for stage, n in sorted(stats.batched.items()):
        lines.append(f'parley_stage_batched_total{{stage="{stage}"}} {n}')
    return "\n".join(lines) + "\n"
