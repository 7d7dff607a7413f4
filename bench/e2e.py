"""Voice-to-voice benchmark: spoken prompts streamed in real time (20 ms frames) to a Parley server, one
conversation, every turn.trace and the client-side latency recorded; prints median/p95 per stage, budget
violations and transcript WER; writes a JSON file and a PNG chart.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.e2e [--server URL] [--prompts 16] [--tiny] [--otlp receiver|hang]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

from bench import _preempt, _prompts, _stats
from bench._client import Prompt, ScriptedSession, TurnResult
from bench._server import ResourceSampler, add_server_args, machine, open_server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(p)
    p.add_argument("--prompts", type=int, default=16, help="how many corpus requests to speak (default 16)")
    p.add_argument("--voices", default="piper,flite", help="voices that speak them, in turn (piper,flite)")
    p.add_argument("--wav", action="append", default=[], metavar="FILE[=TEXT]",
                   help="speak this WAV instead of the corpus (repeatable); TEXT is its words, for WER")
    p.add_argument("--turn-timeout", type=float, default=90.0, help="seconds a turn may take (default 90)")
    p.add_argument("--out", default="artifacts/bench/e2e.json", help="JSON results (default %(default)s)")
    p.add_argument("--chart", default="artifacts/bench/e2e.png", help="PNG chart (default %(default)s); '' skips")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown (for docs/benchmarks.md)")
    p.add_argument("--tiny", action="store_true", help="two prompts, the concise persona: a smoke test")
    p.add_argument("--otlp", choices=("off", "receiver", "hang"), default="off",
                   help="the started server exports spans to an OTLP receiver here, or to one that never answers "
                        "(the cost of export, docs/observability.md)")  # fmt: skip
    args = p.parse_args(argv)
    if args.otlp != "off" and args.server:
        p.error("--otlp sets the started server's export; a running server (--server) keeps its own")
    if args.tiny:
        args.prompts = 2
        args.persona = args.persona or "concise"
    return args


def load_prompts(args: argparse.Namespace) -> list[Prompt]:
    if args.wav:
        return [_prompts.from_wav(*w.split("=", 1)) for w in args.wav]
    return _prompts.corpus_prompts(args.prompts, tuple(args.voices.split(",")))


async def converse(url: str, prompts: list[Prompt], args: argparse.Namespace) -> tuple[list[TurnResult], list[dict]]:
    session = ScriptedSession(url, token=args.token, persona=args.persona, turn_timeout_s=args.turn_timeout,
                              on_result=progress)
    turns = await session.run(prompts)
    return turns, session.errors


def progress(t: TurnResult) -> None:
    v2v = (t.trace or {}).get("stages_ms", {}).get("voice_to_voice")
    print(f"  turn {t.index + 1}: voice_to_voice {_stats.fmt_ms(v2v)} ms, client {_stats.fmt_ms(t.client_v2v_ms)} ms"
          f"{', ' + t.error if t.error else ''}", flush=True)


def report(turns: list[TurnResult], budgets: dict[str, float], errors: list[dict], md: bool) -> dict:
    table = _stats.markdown if md else _stats.table
    summary = _stats.summarize(turns, budgets)
    print("\nPer stage (server trace; client_v2v on the client clock)")
    print(table(_stats.STAGE_HEADER, _stats.stage_rows(summary)))
    print(f"Slowest stage (largest median): {_stats.slowest_stage(summary) or '-'}")
    over = _stats.violations(turns)
    print("\nBudget violations (turns flagged over budget by the server): "
          + (", ".join(f"{s} {n}" for s, n in over.most_common()) or "none"))
    wer = _prompts.wer([t.prompt for t in turns], [t.transcript for t in turns])
    print(f"Transcript WER: {'-' if wer is None else f'{wer:.3f}'} over {len(turns)} turns")
    preemptive = _preempt.summary(t.trace for t in turns)
    print(_preempt.line(preemptive))
    failed = [t for t in turns if t.error]
    print(f"Turns without a trace or reply: {len(failed)}; server error messages: {len(errors)}")
    for t in failed:
        print(f"  turn {t.index + 1}: {t.error}")
    print("\nPer turn")
    rows = [[t.index + 1, t.voice, _stats.fmt_ms((t.trace or {}).get("stages_ms", {}).get("voice_to_voice")),
             _stats.fmt_ms(t.client_v2v_ms), t.prompt[:34], t.transcript[:34]] for t in turns]
    print(table(("#", "voice", "v2v ms", "client ms", "said", "heard"), rows))
    return {"summary": summary, "violations": dict(over), "wer": wer, "failed_turns": len(failed), "preemptive": preemptive,
            "server_errors": errors}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(args)
    print(f"{len(prompts)} prompts, {sum(p.duration_ms for p in prompts) / 1000:.1f} s of speech", flush=True)
    receiver = None
    if args.otlp != "off":
        from bench._otlp import OtlpReceiver

        receiver = OtlpReceiver(hang=args.otlp == "hang")
        args.sets = [*args.sets, f"observability.otlp_endpoint={receiver.url}", "observability.schedule_delay_ms=200"]
    url, server, pid = open_server(args, out)
    before = machine()
    sampler = ResourceSampler(pid)
    sampler.start()
    try:
        turns, errors = asyncio.run(converse(url, prompts, args))
    finally:
        resources = sampler.stop()
        export = otel_counts(url, args.token) if receiver is not None else None
        if server is not None:
            server.stop()
        if receiver is not None:
            receiver.close()
    if export is not None:
        print("span export: " + ", ".join(f"{k} {v:g}" for k, v in export.items()), flush=True)
    budgets = next((dict(t.trace["budgets_ms"]) for t in turns if t.trace), {})
    result = report(turns, budgets, errors, args.markdown)
    result.update(otlp=args.otlp, span_export=export, machine=before, load_avg_after=machine()["load_avg"], server=url, budgets_ms=budgets,
                  persona=args.persona, resources=resources, wall_s=round(time.monotonic() - t0, 1),
                  argv=sys.argv[1:] if argv is None else argv, turns=[t.to_dict() for t in turns])
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}", end="")
    if args.chart:
        from bench._chart import draw

        title = (f"Parley voice-to-voice, {len(turns)} turns, {before['cores']} cores "
                 f"(load {before['load_avg'][0]})")
        print(f" and {draw(turns, result['summary'], budgets, Path(args.chart), title)}", end="")
    print(f" in {result['wall_s']} s")
    return 0 if turns and not result["failed_turns"] else 1


def otel_counts(url: str, token: str | None) -> dict[str, float]:
    """The server's span export counters from /metrics (web.otel.export)."""
    import urllib.request

    req = urllib.request.Request(url.rstrip("/") + "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if m := re.match(r'parley_otel_spans_total\{outcome="(\w+)"\} (\S+)$', line):
            out[m[1]] = float(m[2])
        elif line.startswith("parley_otel_queue_spans "):
            out["queued"] = float(line.split()[1])
    return out


if __name__ == "__main__":
    sys.exit(main())
