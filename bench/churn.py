"""Churn: users who come and go (`python -m bench.load --churn --rate R`). Users arrive by a seeded Poisson process
at R a second; each opens a session, hears the greeting, asks 1-3 spoken questions of the bench corpus, hears each
reply out at real time (bench._client plays as a client would), and leaves. The table: arrivals, refused, errors,
voice-to-voice, sessions open, greetings synthesised and replayed, and where the server's time went per stage
(seconds of engine steps and of shared-worker jobs, from /metrics; server CPU from the process).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from bench import _stats
from bench._client import Prompt, ScriptedSession, TurnResult
from bench._server import ResourceSampler, machine, open_server
from desktop.connection import ConnectError

BUSY = ("llm", "asr", "tts", "turn")


def arrivals(rate_per_s: float, users: int, seed: int) -> list[tuple[float, int]]:
    """(arrival s, questions) per user: exponential gaps at `rate_per_s`, 1-3 questions each, from `seed`."""
    rng = np.random.default_rng(seed)
    at = np.cumsum(rng.exponential(1.0 / rate_per_s, users))
    return [(float(t), int(k)) for t, k in zip(at, rng.integers(1, 4, users))]


def scrape(url: str, token: str | None) -> dict[str, float]:
    """The /metrics counters this bench reads (absent ones: 0)."""
    req = urllib.request.Request(url.rstrip("/") + "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


class OpenSessions:
    """Samples /healthz's session count twice a second, on a thread."""

    def __init__(self, url: str) -> None:
        self.url, self.counts = url.rstrip("/") + "/healthz", [0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "OpenSessions":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    self.counts.append(int(json.loads(r.read()).get("sessions", 0)))
            except OSError:
                pass


async def run_users(url: str, plan: list[tuple[float, int]], pool: list[Prompt], args: argparse.Namespace) -> dict[str, Any]:
    sessions = [ScriptedSession(url, session=i, token=args.token, persona=args.persona, turn_timeout_s=60.0)
                for i in range(len(plan))]  # fmt: skip
    t0 = time.monotonic()
    asked = 0

    async def user(i: int, at_s: float, prompts: list[Prompt]) -> None:
        await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
        await sessions[i].run(prompts)

    tasks = []
    for i, (at_s, k) in enumerate(plan):
        tasks.append(asyncio.create_task(user(i, at_s, [pool[(asked + j) % len(pool)] for j in range(k)])))
        asked += k
    done, pending = await asyncio.wait(tasks, timeout=plan[-1][0] + args.level_timeout)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    refused, errors = 0, [f"user {i}: timeout" for i, t in enumerate(tasks) if t in pending]
    reasons: dict[str, int] = {}
    for i, t in enumerate(tasks):
        exc = None if t.cancelled() else t.exception()
        if isinstance(exc, ConnectError) and "try again later" in str(exc):
            refused += 1
            why = str(exc).split(":", 1)[-1].strip()[:70]  # the rule that refused, without its numbers' tail
            reasons[why] = reasons.get(why, 0) + 1
        elif exc is not None:
            errors.append(f"user {i}: {exc!r}")
    turns: list[TurnResult] = [r for s in sessions for r in s.results]
    errors += [f"user {r.session} turn {r.index + 1}: {r.error}" for r in turns if r.error]
    errors += [f"user {s.session}: server error {e.get('code')}: {e.get('message')}" for s in sessions for e in s.errors]
    return {"turns": turns, "errors": errors, "refused": refused, "refusals": reasons, "wall_s": time.monotonic() - t0}


def run_churn(args: argparse.Namespace, pool: list[Prompt]) -> dict[str, Any]:
    out = Path(args.out)
    plan = arrivals(args.rate, args.users, args.seed)
    if args.tiny:
        plan = [(at, 1) for at, _ in plan]
    url, server, pid = open_server(args, out, (f"server.max_sessions={args.max_sessions}",))
    try:
        before = scrape(url, args.token)
        sampler = ResourceSampler([pid] if pid is not None else [])
        sampler.start()
        with OpenSessions(url) as open_sessions:
            got = asyncio.run(run_users(url, plan, pool, args))
        res = sampler.stop()
        after = scrape(url, args.token)
    finally:
        if server is not None:
            server.stop()
    turns = got["turns"]
    budgets = next((dict(t.trace["budgets_ms"]) for t in turns if t.trace), {})
    summary = _stats.summarize(turns, budgets)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return {
        "rate_per_s": args.rate, "seed": args.seed, "arrivals": len(plan), "refused": got["refused"], "refusals": got["refusals"],
        "errors": len(got["errors"]), "error_list": got["errors"][:20], "turns": len(turns),
        "questions_planned": sum(k for _, k in plan), "v2v_median": summary["voice_to_voice"].get("median"),
        "v2v_p95": summary["voice_to_voice"].get("p95"), "client_v2v_median": summary[_stats.CLIENT_V2V].get("median"),
        "client_v2v_p95": summary[_stats.CLIENT_V2V].get("p95"), "open_mean": float(np.mean(open_sessions.counts)),
        "open_max": max(open_sessions.counts), "greetings_synthesised": int(delta.get("parley_greeting_audio_synthesised_total", 0)),
        "greetings_reused": int(delta.get("parley_greeting_audio_reused_total", 0)),
        "busy_s": {stage: round(delta.get(f"parley_{stage}_busy_seconds_total", 0.0), 1) for stage in BUSY},
        "reply_gaps": _stats.reply_gaps(turns), "wall_s": round(got["wall_s"], 1), "summary": summary, "budgets_ms": budgets, "machine": machine(), **res,
    }  # fmt: skip


def print_churn(r: dict[str, Any], md: bool) -> None:
    f = _stats.fmt_ms
    header = ("rate /s", "arrivals", "refused", "errors", "turns", "v2v med", "v2v p95", "client p95", "open mean/max",
              "stalled replies (max ms)", "greetings synth/replayed", "llm s", "asr s", "tts s", "turn s", "cpu %", "wall s")
    row = [r["rate_per_s"], r["arrivals"], r["refused"], r["errors"], r["turns"], f(r["v2v_median"]), f(r["v2v_p95"]),
           f(r["client_v2v_p95"]), f"{r['open_mean']:.1f}/{r['open_max']}",
           f"{r['reply_gaps']['stalled']} ({f(r['reply_gaps']['max_ms'])})",
           f"{r['greetings_synthesised']}/{r['greetings_reused']}", *(r["busy_s"][s] for s in BUSY),
           f(r["cpu_pct_mean"]), r["wall_s"]]  # fmt: skip
    print("\nChurn: users arriving, asking 1-3 questions, leaving (v2v in ms, server side; llm/asr/tts/turn: seconds "
          "of engine steps and of shared-worker jobs per stage; cpu: server, 100 = one core)")
    print((_stats.markdown if md else _stats.table)(header, [row]))
    for why, n in r["refusals"].items():
        print(f"  refused {n}x: {why}")
    for e in r["error_list"][:5]:
        print(f"  {e}")


def main_churn(args: argparse.Namespace, pool: list[Prompt]) -> int:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = run_churn(args, pool)
    print_churn(result, args.markdown)
    out.write_text(json.dumps({**result, "argv": args.argv}, indent=1, default=str))
    print(f"\nwrote {out}")
    return 0 if result["turns"] else 1
