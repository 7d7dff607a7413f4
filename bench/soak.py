"""Soak and abuse benchmark against one server: a long typed conversation (does it slow down as it grows?), a
history bomb and an audio flood with a bystander's latency beside its own baseline, connect/disconnect cycles,
and the server's RSS over all of it.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.soak [--server URL] [--turns 200] [--markdown] [--tiny]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import _prompts, _stats
from bench._server import ResourceSampler, add_server_args, machine, open_server
from desktop.connection import Connection, ConnectionLost, ws_url

RATE = 16000


class Talker:
    """One session over the wire client: typed or spoken turns, each timed to its reply's first audio."""

    def __init__(self, server: str, token: str | None) -> None:
        self.server, self.token = server, token
        self.conn: Connection | None = None
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "Talker":
        self.conn = Connection(ws_url(self.server), self.token, sample_rate=RATE, open_timeout_s=30.0)
        await self.conn.open("concise", None)
        self._reader = asyncio.create_task(self._read())
        await self.wait(lambda: self.count("response.done") >= 1, 30)  # the greeting
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.conn is not None:
            await self.conn.close()

    async def _read(self) -> None:
        assert self.conn is not None
        while True:
            try:
                raw = await self.conn.recv()
            except ConnectionLost:
                return
            self.events.append((time.monotonic(), {"type": "audio"} if isinstance(raw, bytes) else json.loads(raw)))
            self._changed.set()

    def count(self, kind: str) -> int:
        return sum(1 for _, m in self.events if m.get("type") == kind)

    async def wait(self, cond: Any, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not cond():
                self._changed.clear()
                await self._changed.wait()

    async def typed(self, text: str, timeout_s: float = 120.0) -> dict[str, Any]:
        """Ask by text; -> {first_audio_s, llm_ttft_ms, prefill_tokens, reused_tokens, context}."""
        assert self.conn is not None
        done_before, start = self.count("response.done"), len(self.events)
        t0 = time.monotonic()
        await self.conn.send_json({"type": "input.text", "text": text})
        await self.wait(lambda: self.count("response.done") > done_before, timeout_s)
        first = next((t for t, m in self.events[start:] if m["type"] == "audio"), None)
        await self.wait(lambda: any(m["type"] == "turn.trace" for _, m in self.events[start:]), 10)
        trace = next(m for _, m in self.events[start:] if m["type"] == "turn.trace")
        done = next(m for _, m in reversed(self.events) if m["type"] == "response.done")
        return {"first_audio_s": None if first is None else first - t0, "llm_ttft_ms": trace["stages_ms"].get("llm_ttft"),
                "text": done.get("text", ""),
                "prefill_tokens": trace.get("llm", {}).get("prefill_tokens"), "context": trace.get("context"),
                "reused_tokens": trace.get("llm", {}).get("reused_tokens")}  # fmt: skip

    async def spoken(self, audio: np.ndarray, timeout_s: float = 60.0) -> float:
        """Stream `audio` at real time, then silence; -> seconds from its end to its final transcript."""
        assert self.conn is not None
        before = self.count("transcript.final")
        await self._stream(audio)
        t_end = time.monotonic()
        silence = np.zeros(RATE // 50, dtype=np.float32)
        async with asyncio.timeout(timeout_s):
            while self.count("transcript.final") == before:
                await self._stream(silence)
        return next(t for t, m in reversed(self.events) if m["type"] == "transcript.final") - t_end

    async def _stream(self, audio: np.ndarray) -> None:
        assert self.conn is not None
        n, t0 = RATE // 50, time.monotonic()
        for k, i in enumerate(range(0, len(audio), n)):
            await self.conn.send_audio((np.clip(audio[i : i + n], -1, 1) * 32767).astype("<i2").tobytes())
            ahead = (k + 1) * 0.02 - (time.monotonic() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)


def worst_first_tokens(results: list[dict[str, Any]], n: int = 5) -> list[list[object]]:
    """The conversation's slowest first tokens: turn, llm_ttft, prompt tokens computed and reused, a drop just before."""
    timed = [(r["llm_ttft_ms"], i) for i, r in enumerate(results) if r["llm_ttft_ms"] is not None]
    rows = []
    for ttft, i in sorted(timed, reverse=True)[:n]:
        r, before = results[i], results[i - 1] if i else {}
        rows.append([i + 1, _stats.fmt_ms(ttft), r["prefill_tokens"], r["reused_tokens"],
                     "yes" if before.get("context") or r["context"] else "no"])  # fmt: skip
    return rows


FACT_TURN = 3  # the user says who they are here, and is asked it again at the last turn
FACT, FACT_QUESTION, FACT_ANSWER = "My name is Ana and my dog is called Biscuit.", "What is my dog called?", "biscuit"


def ask(i: int, turns: int) -> str:
    """The long conversation's turn i (from 1): a fact about the user at FACT_TURN, asked back at the last turn."""
    if i == FACT_TURN:
        return FACT
    return FACT_QUESTION if i == turns else f"Turn {i}: tell me one short fact about the number {i}."


async def long_conversation(server: str, token: str | None, turns: int, window: int,
                            worst: list[list[object]] | None = None, recall: dict[str, Any] | None = None) -> list[list[object]]:  # fmt: skip
    """`recall`: gets the last turn's answer to FACT_QUESTION and whether it holds FACT_ANSWER."""
    rows, results = [], []
    async with Talker(server, token) as t:
        for i in range(turns):
            try:
                results.append(await t.typed(ask(i + 1, turns)))
            except TimeoutError:  # its reply never came: said in the table, and the conversation ends here
                if worst is not None:
                    worst.append([i + 1, "no reply in 120 s", "-", "-", "-"])
                break
    if worst is not None:
        worst += worst_first_tokens(results)
    if recall is not None and len(results) == turns:
        answer = results[-1]["text"]
        recall.update(answer=answer, right=FACT_ANSWER in answer.lower(), summaries=sum(
            1 for r in results if (r["context"] or {}).get("summary")), drops=sum(1 for r in results if (r["context"] or {}).get("dropped_messages")))
    for k in range(0, turns, window):
        part = results[k : k + window]
        ttft = [r["llm_ttft_ms"] for r in part if r["llm_ttft_ms"] is not None]
        first = [1000 * r["first_audio_s"] for r in part if r["first_audio_s"] is not None]
        rows.append([f"{k + 1}-{k + len(part)}", _stats.fmt_ms(_stats.percentile(ttft, 50)), _stats.fmt_ms(_stats.percentile(ttft, 95)),
                     _stats.fmt_ms(_stats.percentile(first, 50)), _stats.fmt_ms(max(r["prefill_tokens"] or 0 for r in part)),
                     sum(1 for r in part if r["context"])])  # fmt: skip
    return rows


async def bystander_beside(server: str, token: str | None, attack: str, question: np.ndarray,
                           out: dict[str, Any] | None = None) -> list[object]:  # fmt: skip
    async with Talker(server, token) as bystander:
        alone = await (bystander.typed("Say hello.") if attack == "history bomb" else bystander.spoken(question))
        async with Talker(server, token) as attacker:
            assert attacker.conn is not None
            if attack == "history bomb":
                for i in range(300):
                    await attacker.conn.send_json({"type": "input.text", "text": f"{i} " + "tell me everything about the sea " * 60})
                    await asyncio.sleep(0.05)
                # the bomber's own question, and the bystander asking on until it is answered: the whole backlog
                t_ask = time.monotonic()
                await attacker.conn.send_json({"type": "input.text", "text": "And what is the capital of France?"})
                answered = attacker.count("response.done")
                loaded = await bystander.typed("Say hello again.")
                backlog = [loaded]
                while attacker.count("response.done") <= answered and time.monotonic() - t_ask < 600:
                    backlog.append(await bystander.typed(f"Say hello, number {len(backlog)}."))
                bomber_s = time.monotonic() - t_ask
                if out is not None:
                    out["bomb"] = {"bystander_ttft_ms": [r["llm_ttft_ms"] for r in backlog],
                                   "bystander_first_audio_ms": [round(1000 * r["first_audio_s"], 1) for r in backlog if r["first_audio_s"]],
                                   "bomber_question_s": round(bomber_s, 1), "alone_ttft_ms": alone["llm_ttft_ms"]}  # fmt: skip
            else:
                noise = (np.random.default_rng(0).standard_normal(RATE) * 0.3 * 32767).astype("<i2").tobytes()

                async def flood() -> None:
                    for _ in range(250):  # 1 s messages at 50 times real time
                        await attacker.conn.send_audio(noise)  # type: ignore[union-attr]
                        await asyncio.sleep(0.02)

                flooding = asyncio.create_task(flood())
                loaded = await bystander.spoken(question)
                await flooding
            dropped = [m for _, m in attacker.events if m.get("type") == "error"]
    if attack == "history bomb":
        a, b = alone["first_audio_s"], loaded["first_audio_s"]
        what = "typed turn: first reply audio"
    else:
        a, b = alone, loaded
        what = "spoken turn: final transcript after speech"
    return [attack, what, f"{1000 * a:.0f}", f"{1000 * b:.0f}", f"{b / a:.1f}x", len(dropped)]


async def drops(server: str, token: str | None, n: int, restart: Any = None) -> dict[str, Any]:
    """One conversation whose connection drops `n` times (the socket cut, no close frame) and reconnects with its
    resume token; with `restart` (a callable that restarts the server) the last drop is a server restart instead.
    -> reconnects, how many carried the conversation on, resume time (reconnect to session.ready) and whether the
    fact said before the first drop was still known after the last."""
    resumed, times_ms = 0, []
    async with Talker(server, token) as t:
        assert t.conn is not None
        await t.typed(FACT)
        for i in range(n):
            if restart is not None and i == n - 1:
                await asyncio.to_thread(restart)
            else:
                t.conn._ws.transport.abort()  # the network goes: the server sees no close frame
            if t._reader is not None:
                await asyncio.wait({t._reader}, timeout=10)
            t0 = time.monotonic()
            await t.conn.open("concise", None)
            times_ms.append(1000 * (time.monotonic() - t0))
            resumed += t.conn.resumed
            t.events.clear()
            t._reader = asyncio.create_task(t._read())
        answer = (await t.typed(FACT_QUESTION))["text"]
    return {"reconnects": n, "resumed": resumed, "resume_ms_p50": _stats.percentile(times_ms, 50),
            "resume_ms_p95": _stats.percentile(times_ms, 95), "answer": answer, "right": FACT_ANSWER in answer.lower()}


async def churn(server: str, token: str | None, cycles: int) -> float:
    t0 = time.monotonic()
    for _ in range(cycles):
        conn = Connection(ws_url(server), token, sample_rate=RATE, open_timeout_s=30.0)
        await conn.open("concise", None)
        await conn.close()
    return (time.monotonic() - t0) / cycles


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(p)
    p.add_argument("--turns", type=int, default=200, help="turns of the long conversation (default 200)")
    p.add_argument("--window", type=int, default=25, help="turns per row of its table (default 25)")
    p.add_argument("--cycles", type=int, default=100, help="connect/disconnect cycles (default 100)")
    p.add_argument("--out", default="artifacts/bench/soak.json")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--tiny", action="store_true", help="4 turns, 5 cycles, no abuse: a smoke test")
    p.add_argument("--no-abuse", action="store_true", help="skip the history bomb and the audio flood")
    p.add_argument("--drops", type=int, default=10, help="times one conversation's socket is cut and resumed (0: none)")
    p.add_argument("--restart", action="store_true", help="the last drop is a restart of the server (SIGTERM)")
    args = p.parse_args(argv)
    if args.tiny:
        args.turns, args.window, args.cycles, args.drops = 4, 2, 5, 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # the message rate limit raised so that the history bomb is paced by itself (20 a second), as found
    url, server, pid = open_server(args, out, extra_sets=("server.max_messages_per_s=1000",))
    sampler = ResourceSampler(pid)
    sampler.start()
    t0 = time.monotonic()
    table = _stats.markdown if args.markdown else _stats.table
    result: dict[str, Any] = {"machine": machine()}
    try:
        worst: list[list[object]] = []
        recall: dict[str, Any] = {}
        conversation = asyncio.run(long_conversation(url, args.token, args.turns, args.window, worst, recall))
        print(f"\nOne conversation of {args.turns} typed turns (concise persona)")
        print(table(("turns", "llm_ttft p50 ms", "p95 ms", "first audio p50 ms", "max prefill tokens", "context drops"), conversation))
        print("\nIts slowest first tokens")
        print(table(("turn", "llm_ttft ms", "prompt tokens computed", "reused", "history dropped at or before"), worst))
        result["conversation"], result["worst_first_tokens"], result["recall"] = conversation, worst, recall
        if recall:
            print(f"\nTurn {FACT_TURN} said {FACT!r}; turn {args.turns} asked {FACT_QUESTION!r}: {recall['answer']!r} "
                  f"({'right' if recall['right'] else 'wrong'}; {recall['summaries']} summaries, {recall['drops']} drops)")
        if not args.tiny and not args.no_abuse:
            question = _prompts.spoken("What is the capital of France?", "piper").audio
            abuse = [asyncio.run(bystander_beside(url, args.token, a, question, result)) for a in ("history bomb", "audio flood")]
            print("\nA bystander beside an attacker (the same bystander alone first)")
            print(table(("attack", "measured", "alone ms", "beside ms", "ratio", "attacker errors"), abuse))
            result["abuse"] = abuse
            bomb = result["bomb"]
            ttft = [v for v in bomb["bystander_ttft_ms"] if v is not None]
            print(f"\nHistory bomb backlog: the bomber's own question answered after {bomb['bomber_question_s']} s; "
                  f"meanwhile the bystander asked {len(bomb['bystander_ttft_ms'])} times, llm_ttft median "
                  f"{_stats.fmt_ms(_stats.percentile(ttft, 50))} ms, max {_stats.fmt_ms(max(ttft, default=None))} ms "
                  f"(alone {_stats.fmt_ms(bomb['alone_ttft_ms'])} ms)")  # fmt: skip
        if args.drops:
            restart = (lambda: (server.stop(), server.start())) if server is not None and args.restart else None
            dropped = asyncio.run(drops(url, args.token, args.drops, restart))
            print(f"\n{args.drops} drops{' (the last a server restart)' if restart else ''}: {dropped['resumed']} resumed, "
                  f"resume p50 {_stats.fmt_ms(dropped['resume_ms_p50'])} ms, p95 {_stats.fmt_ms(dropped['resume_ms_p95'])} ms; "
                  f"asked after them {FACT_QUESTION!r}: {dropped['answer']!r}")  # fmt: skip
            result["drops"] = dropped
        per_cycle = asyncio.run(churn(url, args.token, args.cycles))
        print(f"\n{args.cycles} connect/disconnect cycles: {1000 * per_cycle:.0f} ms each")
        result["cycle_ms"] = round(1000 * per_cycle, 1)
    finally:
        resources = sampler.stop()
        if server is not None:
            server.stop()
    result.update(resources=resources, wall_s=round(time.monotonic() - t0, 1))
    rss = sampler.rss_mb
    result["rss_mb"] = [round(x) for x in rss[:: max(1, len(rss) // 40)]]
    print(f"server RSS: start {rss[0]:.0f} MB, max {max(rss):.0f} MB, end {rss[-1]:.0f} MB; {result['wall_s']} s" if rss else
          f"server RSS not sampled; {result['wall_s']} s")  # fmt: skip
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
