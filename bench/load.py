"""Concurrency benchmark: 1, 2, 4, 8, 16 sessions at once, each holding a spoken conversation in real time;
per level voice_to_voice median/p95, errors, server CPU and memory; the most sessions that hold the budgets.

--scheduling both: the same levels with the stages scheduled as before (`server.scheduling: direct`, every
recognition, synthesis and check on a thread of its own at once, no admission control) and after (the shared
scheduler, admission from measured capacity), side by side with each stage's queue waits. A session the server
refuses (`server_full`) counts as refused, not as an error. The "before" server is always started for the run; with
--server the "after" side runs on that one (it must schedule as shipped).

--topology split: one `parley stages` process and two `parley serve` front ends whose three stages are remote
(sessions dealt round-robin, as a load balancer would), instead of everything in one process; `both` runs the
two in turn and prints them side by side, with what the HTTP hop costs each stage.

--churn: users who come and go (bench.churn): seeded Poisson arrivals at --rate a second, --users in all.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.load [--server URL] [--levels 1,2,4,8,16] [--turns 3]
      [--topology one|split|both] [--scheduling before|after|both] [--tiny]
      HF_HUB_OFFLINE=1 .venv/bin/python -m bench.load --churn --rate 0.25 [--users 24] [--seed 1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench import _preempt, _prompts, _stats, corpus
from bench._client import Prompt, ScriptedSession, TurnResult
from bench._server import ROOT, ResourceSampler, add_server_args, machine, open_server, start_server
from bench.parley_process import ParleyProcess
from desktop.connection import ConnectError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(p)
    p.add_argument("--levels", default="1,2,4,8,16", help="concurrent session counts (default %(default)s)")
    p.add_argument("--turns", type=int, default=3, help="spoken turns per session (default 3)")
    p.add_argument("--stagger", type=float, default=2.0,
                   help="seconds over which a level's sessions join, so they do not all speak at once (default 2)")
    p.add_argument("--level-timeout", type=float, default=150.0,
                   help="seconds a level may run; unfinished turns count as errors (default 150: a reply at the "
                        "persona's length cap plays for ~35 s, and the session speaks on only after it)")
    p.add_argument("--out", default="artifacts/bench/load.json", help="JSON results (default %(default)s)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown (for docs/benchmarks.md)")
    p.add_argument("--topology", choices=("one", "split", "both"), default="one",
                   help="one process, or front ends + a stage server over HTTP, or both in turn (default one)")
    p.add_argument("--scheduling", choices=("before", "after", "both"), default="after",
                   help="the stage scheduling before the shared scheduler, after it, or both in turn (default after)")
    p.add_argument("--fronts", type=int, default=2, help="front ends in the split topology (default 2)")
    p.add_argument("--tiny", action="store_true", help="one level of two sessions, one turn each: a smoke test")
    p.add_argument("--churn", action="store_true", help="users who come and go instead of levels (bench.churn)")
    p.add_argument("--rate", type=float, default=0.25, help="--churn: users arriving a second (default %(default)s)")
    p.add_argument("--users", type=int, default=24, help="--churn: users in all (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="--churn: the arrivals' and questions' seed (default 1)")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.max_sessions = 32  # the default config's
    if args.server and args.topology != "one":
        p.error("--topology split/both starts its own processes: it cannot use --server")
    if args.topology == "both" and args.scheduling == "both":
        p.error("compare topologies or schedulings in one run, not both")
    if args.tiny:
        args.levels, args.turns = "2", 1
        args.persona = args.persona or "concise"
        args.users, args.rate = (2, 2.0) if args.churn else (args.users, args.rate)
    args.levels = [int(n) for n in str(args.levels).split(",")]
    return args


async def run_level(urls: list[str], n: int, pool: list[Prompt], args: argparse.Namespace) -> tuple[list[TurnResult], list[str], int]:
    """`n` sessions at once, dealt over `urls`; session i says pool[i*turns : (i+1)*turns] (wrapping), joining
    i*stagger/n s late."""
    sessions = [ScriptedSession(urls[i % len(urls)], session=i, token=args.token, persona=args.persona,
                                turn_timeout_s=60.0) for i in range(n)]  # fmt: skip

    async def one(i: int) -> None:
        await asyncio.sleep(i * args.stagger / n)
        prompts = [pool[(i * args.turns + k) % len(pool)] for k in range(args.turns)]
        await sessions[i].run(prompts)

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    done, pending = await asyncio.wait(tasks, timeout=args.level_timeout)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    errors: list[str] = [f"session {i}: level timeout" for i, t in enumerate(tasks) if t in pending]
    refused = 0
    for i, t in enumerate(tasks):
        exc = None if t.cancelled() else t.exception()
        if isinstance(exc, ConnectError) and "try again later" in str(exc):
            refused += 1  # server_full: admission control said no, with its reason
        elif isinstance(exc, ConnectError):
            errors.append(f"session {i}: {exc}")
        elif exc is not None:
            errors.append(f"session {i}: {exc!r}")
    turns = [r for s in sessions for r in s.results]
    errors += [f"session {r.session} turn {r.index + 1}: {r.error}" for r in turns if r.error]
    errors += [f"session {s.session}: server error {e.get('code')}: {e.get('message')}" for s in sessions for e in s.errors]
    missing = (n - refused) * args.turns - len(turns)
    if missing > 0:
        errors.append(f"{missing} turns never spoken")
    return turns, errors, refused


def wait_idle(url: str, timeout_s: float = 30.0) -> None:
    """Between levels: wait until the server has no sessions and no busy engine slot, so levels do not overlap (the
    last session leaving also clears the recent latencies its admission goes by)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/healthz", timeout=5) as r:
                body = json.loads(r.read())
            if body.get("sessions", 0) == 0 and not body.get("engine_slots"):
                return
        except OSError:
            pass
        time.sleep(0.5)


def partial_counts(url: str, token: str | None = None) -> tuple[int, int] | None:
    """From the server's /metrics: partial transcripts run and dropped so far (None: no shared scheduler)."""
    req = urllib.request.Request(url.rstrip("/") + "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    run = skipped = 0
    found = False
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == "parley_stage_jobs_running":  # the shared scheduler reports (none under `scheduling: direct`)
            found = True
        elif name == 'parley_stage_queue_wait_ms_count{stage="asr",priority="partial"}':
            run = int(float(value))
        elif name.startswith('parley_stage_skipped_total{stage="asr"'):
            skipped += int(float(value))
    return (run, skipped) if found else None


QUEUED_STAGES = ("asr", "turn", "tts")


def queue_waits(turns: list[TurnResult]) -> dict[str, dict[str, float | None]]:
    """Per stage, the median and p95 of how long a turn's job waited for a shared worker (trace `queue_ms`)."""
    out: dict[str, dict[str, float | None]] = {}
    for stage in QUEUED_STAGES:
        waits = sorted(float(t.trace["queue_ms"][stage]) for t in turns if t.trace and stage in t.trace.get("queue_ms", {}))
        if waits:
            out[stage] = {"median": _stats.percentile(waits, 50), "p95": _stats.percentile(waits, 95), "n": len(waits)}
        else:
            out[stage] = {"median": None, "p95": None, "n": 0}
    return out


def level_row(n: int, turns: list[TurnResult], errors: list[str], res: dict[str, Any], budgets: dict[str, float],
              wall_s: float, refused: int = 0, partials: tuple[int, int] | None = None) -> dict[str, Any]:
    summary = _stats.summarize(turns, budgets)
    v2v, client = summary["voice_to_voice"], summary[_stats.CLIENT_V2V]
    over_any = sum(1 for t in turns if t.trace and t.trace.get("over_budget"))
    return {"sessions": n, "turns": len(turns), "errors": len(errors), "error_list": errors[:20],
            "v2v_median": v2v.get("median"), "v2v_p95": v2v.get("p95"), "client_v2v_median": client.get("median"),
            "client_v2v_p95": client.get("p95"), "turns_over_budget": over_any, "summary": summary,
            "holds": not errors and _stats.holds_budget(v2v),
            "holds_all": not errors and all(_stats.holds_budget(summary[s]) for s in budgets if summary.get(s, {}).get("n")),
            "slowest_stage": _stats.slowest_stage(summary), "wall_s": round(wall_s, 1), "refused": refused,
            "queue_ms": queue_waits(turns), "reply_gaps": _stats.reply_gaps(turns), "partials_run": partials[0] if partials else None,
            "partials_skipped": partials[1] if partials else None, "preemptive": _preempt.summary(t.trace for t in turns),
            **res}


def open_split(args: argparse.Namespace, out: Path, sets: tuple[str, ...]) -> tuple[list[str], list[ParleyProcess]]:
    """A `parley stages` process and `args.fronts` front ends whose recognition, LLM and voice point at it."""
    logs = ROOT / "artifacts" / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    stages = start_server(logs / f"{out.stem}.stages.traces.jsonl", logs / f"{out.stem}.stages.log", config=args.config,
                          sets=tuple(args.sets), command="stages")  # fmt: skip
    servers = [stages]
    remote = f'{{base_url: "{stages.url}/v1"}}'
    remote_sets = ("models.asr.backend=openai", f"models.asr.remote={remote}", "models.llm.backend=openai",
                   f"models.llm.remote={remote}", "voices.joe.backend=openai", f"voices.joe.remote={remote}",
                   "voices.joe.speaker=joe")  # fmt: skip

    def front(i: int) -> ParleyProcess:
        return start_server(logs / f"{out.stem}.front{i}.traces.jsonl", logs / f"{out.stem}.front{i}.log",
                            config=args.config, sets=(*sets, *remote_sets, *args.sets))  # fmt: skip

    with ThreadPoolExecutor(args.fronts) as pool:  # together: a front end's start is mostly imports
        starting = [pool.submit(front, i) for i in range(args.fronts)]
    failed = [f.exception() for f in starting if f.exception() is not None]
    servers += [f.result() for f in starting if f.exception() is None]
    if failed:
        for server in servers:
            server.stop()
        raise failed[0]  # type: ignore[misc]
    print(f"started parley stages at {stages.url} and {args.fronts} front ends: "
          + ", ".join(s.url for s in servers[1:]), flush=True)  # fmt: skip
    return [s.url for s in servers[1:]], servers


BEFORE = ("server.scheduling=direct", "server.sessions_per_core=0", "server.admit_max_wait_ms=0", "server.admit_v2v_ratio=0",
          "server.admit_cost_model=false")


def run_topology(topology: str, args: argparse.Namespace, pool: list[Prompt], out: Path,
                 extra: tuple[str, ...] = (), name: str = "") -> tuple[list[dict[str, Any]], dict[str, float]]:  # fmt: skip
    sets = (f"server.max_sessions={max(args.levels)}", *extra)
    name = name or topology
    if topology == "split":
        urls, servers = open_split(args, out, sets)
        pids: list[int] = [s.proc.pid for s in servers]
    else:
        url, server, pid = open_server(args, out, sets)
        urls, servers, pids = [url], [server] if server is not None else [], [pid] if pid is not None else []
    rows: list[dict[str, Any]] = []
    budgets: dict[str, float] = {}
    try:
        for n in args.levels:
            for url in urls:
                wait_idle(url)
            counts_before = [partial_counts(url, args.token) for url in urls]
            sampler = ResourceSampler(pids)
            sampler.start()
            t_level = time.monotonic()
            turns, errors, refused = asyncio.run(run_level(urls, n, pool, args))
            res = sampler.stop()
            counts = [partial_counts(url, args.token) for url in urls]
            partials = None  # partials run / dropped during this level, over every server
            if None not in counts + counts_before:
                a, b = np.sum(counts, axis=0), np.sum(counts_before, axis=0)
                partials = (int(a[0] - b[0]), int(a[1] - b[1]))
            budgets = budgets or next((dict(t.trace["budgets_ms"]) for t in turns if t.trace), {})
            rows.append(level_row(n, turns, errors, res, budgets, time.monotonic() - t_level, refused, partials))
            r = rows[-1]
            print(f"  [{name}] {n:>2} sessions: {r['turns']} turns, v2v median {_stats.fmt_ms(r['v2v_median'])} ms, "
                  f"p95 {_stats.fmt_ms(r['v2v_p95'])} ms, {r['errors']} errors, {refused} refused, {r['wall_s']} s",
                  flush=True)  # fmt: skip
    finally:
        for server in servers:
            server.stop()
    return rows, budgets


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    need = min(max(args.levels) * args.turns, len(corpus.REQUESTS))
    if args.churn:
        from bench.churn import main_churn

        return main_churn(args, _prompts.corpus_prompts(min(3 * args.users, len(corpus.REQUESTS))))
    pool = _prompts.corpus_prompts(need)
    print(f"{len(pool)} distinct prompts; levels {args.levels}, {args.turns} turns a session", flush=True)
    before = machine()
    if args.scheduling == "both":
        plan = [("before", "one", BEFORE), ("after", "one", ())]
    elif args.topology == "both":
        plan = [("one", "one", ()), ("split", "split", ())]
    else:
        plan = [(args.topology, args.topology, BEFORE if args.scheduling == "before" else ())]
    runs: dict[str, list[dict[str, Any]]] = {}
    budgets: dict[str, float] = {}
    for name, topology, extra in plan:
        own = name == "before" and args.scheduling == "both"  # started for the run, whatever --server names
        runs[name], got = run_topology(topology, argparse.Namespace(**{**vars(args), "server": None}) if own else args,
                                       pool, out, extra, name)  # fmt: skip
        budgets = budgets or got
    for name, rows in runs.items():
        if len(runs) > 1:
            print(f"\n## {name}")
        print_report(rows, budgets, args.markdown)
    if "split" in runs and "one" in runs:
        print_side_by_side(runs["one"], runs["split"], args.markdown)
    if "before" in runs and "after" in runs:
        print_before_after(runs["before"], runs["after"], args.markdown)
    topologies = [name for name, _, _ in plan]
    rows = runs[topologies[-1]]
    held = [r["sessions"] for r in rows if r["holds"]]
    held_all = [r["sessions"] for r in rows if r["holds_all"]]
    result = {"levels": rows, "max_sessions_within_budget": max(held, default=0),
              "max_sessions_within_all_budgets": max(held_all, default=0), "budgets_ms": budgets,
              "topologies": {t: r for t, r in runs.items()} if len(runs) > 1 else {topologies[0]: rows},
              "machine": before, "load_avg_after": machine()["load_avg"], "server": args.server, "persona": args.persona,
              "turns_per_session": args.turns, "wall_s": round(time.monotonic() - t0, 1),
              "argv": sys.argv[1:] if argv is None else argv}  # fmt: skip
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out} in {result['wall_s']} s")
    return 0 if all(r and all(x["turns"] for x in r) for r in runs.values()) else 1


HOP_STAGES = ("asr", "llm_ttft", "tts", "voice_to_voice")


def print_before_after(before: list[dict[str, Any]], after: list[dict[str, Any]], md: bool) -> None:
    """v2v, errors, refusals, queue waits, CPU and memory per level, before and after the shared scheduler."""
    f = _stats.fmt_ms
    by_n = {r["sessions"]: r for r in after}
    header = ("sessions", "before med", "before p95", "after med", "after p95", "before err", "after err", "refused",
              "asr wait p95", "turn wait p95", "tts wait p95", "before cpu %", "after cpu %", "before MiB", "after MiB")
    table = []
    for b in before:
        a = by_n.get(b["sessions"])
        if a is None:
            continue
        q = a["queue_ms"]
        table.append([b["sessions"], f(b["v2v_median"]), f(b["v2v_p95"]), f(a["v2v_median"]), f(a["v2v_p95"]),
                      b["errors"], a["errors"], a["refused"], f(q["asr"]["p95"]), f(q["turn"]["p95"]), f(q["tts"]["p95"]),
                      f(b["cpu_pct_mean"]), f(a["cpu_pct_mean"]), f(b["rss_mb_max"]), f(a["rss_mb_max"])])  # fmt: skip
    print("\nBefore (each stage on its own thread at once) vs after (shared scheduler, admission); v2v in ms, server "
          "side; waits: the after run's queue waits, ms")  # fmt: skip
    print((_stats.markdown if md else _stats.table)(header, table))


def print_side_by_side(one: list[dict[str, Any]], split: list[dict[str, Any]], md: bool) -> None:
    """v2v per level in both topologies, then each stage's median in both: the HTTP hop's cost per stage."""
    f = _stats.fmt_ms
    by_n = {r["sessions"]: r for r in split}
    header = ("sessions", "one v2v med", "one v2v p95", "split v2v med", "split v2v p95", "one errors", "split errors")
    table = [[r["sessions"], f(r["v2v_median"]), f(r["v2v_p95"]), f(by_n[r["sessions"]]["v2v_median"]),
              f(by_n[r["sessions"]]["v2v_p95"]), r["errors"], by_n[r["sessions"]]["errors"]]
             for r in one if r["sessions"] in by_n]  # fmt: skip
    print("\nOne process vs front ends + a stage server (ms)")
    print((_stats.markdown if md else _stats.table)(header, table))
    header = ("sessions", "stage", "one median", "split median", "split - one")
    table = []
    for r in one:
        other = by_n.get(r["sessions"])
        if other is None:
            continue
        for stage in HOP_STAGES:
            a, b = r["summary"].get(stage, {}).get("median"), other["summary"].get(stage, {}).get("median")
            table.append([r["sessions"], stage, f(a), f(b), f(b - a) if a is not None and b is not None else "-"])
    print("\nWhat the HTTP hop costs each stage (medians, ms; asr counts from the endpoint, so it can be negative)")
    print((_stats.markdown if md else _stats.table)(header, table))


def print_report(rows: list[dict[str, Any]], budgets: dict[str, float], md: bool) -> None:
    header = ("sessions", "turns", "v2v med", "v2v p95", "client med", "client p95", "over", "errors", "cpu %",
              "rss MiB", "partials run/dropped", "stalled replies (longest ms)", "slowest stage", "holds")
    f = _stats.fmt_ms
    table = [[r["sessions"], r["turns"], f(r["v2v_median"]), f(r["v2v_p95"]), f(r["client_v2v_median"]),
              f(r["client_v2v_p95"]), r["turns_over_budget"], r["errors"], f(r["cpu_pct_mean"]), f(r["rss_mb_max"]),
              "-" if r.get("partials_run") is None else f"{r['partials_run']}/{r['partials_skipped']}",
              f"{r['reply_gaps']['stalled']} ({f(r['reply_gaps']['max_ms'])})",
              r["slowest_stage"] or "-", "yes" if r["holds"] else "no"] for r in rows]
    print(f"\nConcurrent sessions (ms; voice_to_voice budget {f(budgets.get('voice_to_voice'))} ms; "
          "'over': turns with any stage over budget; cpu: server, 100 = one core; stalled: replies whose speech "
          f"stopped {_stats.GAP_MS:.0f} ms or more for audio not yet sent)")
    print((_stats.markdown if md else _stats.table)(header, table))
    held = [r["sessions"] for r in rows if r["holds"]]
    held_all = [r["sessions"] for r in rows if r["holds_all"]]
    print(f"Most sessions holding the voice_to_voice budget at p95 with no errors: {max(held, default=0)}; "
          f"holding every stage's budget at p95: {max(held_all, default=0)}")
    for r in rows:
        print(f"  [{r['sessions']} sessions] {_preempt.line(r['preemptive'])}")
    for r in rows:
        for e in r["error_list"][:3]:
            print(f"  [{r['sessions']} sessions] {e}")


if __name__ == "__main__":
    sys.exit(main())
