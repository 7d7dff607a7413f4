"""With a remote LLM, is the prefill ahead of the endpoint worth a request? Against `parley stages`, a typed
conversation's reply time to first token, with and without a 1-token request for the same prompt sent first (as
voice.remote.llm does at the user's pause; here it has finished before the reply is asked for, as it has by the
endpoint when the final recognition lands early). Through the same `openai` SDK the front end uses.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.remote_ahead [--server URL] [--turns 8] [--markdown] [--tiny]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import _stats, corpus
from bench._server import ROOT, start_server

SYSTEM = "You are a helpful voice assistant. Answer in one or two short sentences."


async def conversation(client: Any, model: str, user: str, questions: list[str], warm: bool) -> list[dict[str, float]]:
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    rows = []
    for q in questions:
        messages.append({"role": "user", "content": q})
        warm_ms = 0.0
        if warm:
            t0 = time.perf_counter()
            await client.chat.completions.create(model=model, messages=messages, max_tokens=1, temperature=0, user=user)
            warm_ms = 1000 * (time.perf_counter() - t0)
        t0 = time.perf_counter()
        stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=40, temperature=0,
                                                      user=user, stream=True, stream_options={"include_usage": True})  # fmt: skip
        ttft, text, cached, prompt = None, [], 0, 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft or 1000 * (time.perf_counter() - t0)
                text.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                prompt = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                cached = (details.cached_tokens or 0) if details is not None else 0
        messages.append({"role": "assistant", "content": "".join(text)})
        rows.append({"ttft_ms": ttft or 0.0, "warm_ms": warm_ms, "prompt_tokens": prompt, "prefilled": prompt - cached})
    return rows


async def run(url: str, token: str | None, turns: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key=token or "none", max_retries=0)
    model = (await client.models.list()).data[0].id
    questions = [p for p in corpus.REQUESTS][:turns]
    out: dict[str, list[dict[str, float]]] = {"no warm-up": [], "1-token warm-up": []}
    for r in range(rounds):  # alternate, so drift on a shared machine falls on both
        for name, warm in (("no warm-up", False), ("1-token warm-up", True)):
            out[name] += await conversation(client, model, f"bench-{r}-{warm}", questions, warm)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", help="a running `parley stages` (default: start one)")
    p.add_argument("--token")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="artifacts/bench/remote_ahead.json")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--tiny", action="store_true", help="2 turns, 1 round: a smoke test")
    args = p.parse_args(argv)
    if args.tiny:
        args.turns, args.rounds = 2, 1
    server = None
    url = args.server
    if url is None:
        logs = ROOT / "artifacts" / "bench"
        logs.mkdir(parents=True, exist_ok=True)
        server = start_server(logs / "remote_ahead.traces.jsonl", logs / "remote_ahead.stages.log", command="stages")
        url = server.url
    try:
        result = asyncio.run(run(url, args.token, args.turns, args.rounds))
    finally:
        if server is not None:
            server.stop()
    f = _stats.fmt_ms
    header = ("reply", "turns", "ttft p50 ms", "ttft p95 ms", "prompt tokens prefilled p50", "warm-up p50 ms")
    table = []
    for name, rows in result.items():
        t = [r["ttft_ms"] for r in rows]
        table.append([name, len(rows), f(_stats.percentile(t, 50)), f(_stats.percentile(t, 95)),
                      int(_stats.percentile([r["prefilled"] for r in rows], 50)),
                      f(_stats.percentile([r["warm_ms"] for r in rows], 50)) if rows[0]["warm_ms"] else "-"])  # fmt: skip
    print(f"\nA conversation's replies through `parley stages` ({args.turns} turns x {args.rounds} rounds)")
    print((_stats.markdown if args.markdown else _stats.table)(header, table))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": result, "server": args.server, "turns": args.turns, "rounds": args.rounds}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
