"""The same spoken conversation over the WebSocket and over WebRTC through a lossy link (bench._lossy: seeded loss,
40 ms ± 20 ms each way), at several loss rates, against one real server. Per transport and loss: voice-to-voice
on the client's clock (last voiced sample sent -> first reply audio), the longest stall inside a reply as the
client plays what arrives, reply audio lost (WebRTC: missing 20 ms frames; TCP loses none, it waits), and the
server's recognition of the user's speech (WER).

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.network [--server URL] [--persona P] [--tiny] [--turns 4]
        [--loss 0,2,5] [--markdown]
"""
from __future__ import annotations

import argparse
import asyncio
import fractions
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import _stats
from bench._client import Prompt, ScriptedSession
from bench._lossy import Link, TcpProxy, UdpRelay
from bench._prompts import corpus_prompts, wer
from bench._server import start_server
from web.webrtc_loss import skip_lost_packets

OPUS_RATE, FRAME = 48000, 960
AUDIBLE_RMS = 0.01
_CANDIDATE = re.compile(r"^a=candidate:(\S+) (\d) (\S+) (\d+) (\S+) (\d+) typ host(.*)$")


def _relayed(sdp: str, port: int) -> tuple[str, tuple[str, int]]:
    """`sdp` with its one IPv4 UDP host candidate moved to the relay's `port` (others dropped). -> (sdp, real)."""
    lines, real = [], None
    for line in sdp.splitlines():
        m = _CANDIDATE.match(line)
        if m is None:
            lines.append(line)
        elif real is None and m.group(3).lower() == "udp" and ":" not in m.group(5) and m.group(2) == "1":
            real = (m.group(5), int(m.group(6)))
            lines.append(f"a=candidate:{m.group(1)} 1 {m.group(3)} {m.group(4)} {m.group(5)} {port} typ host{m.group(7)}")
    if real is None:
        raise RuntimeError("no IPv4 host candidate (WebRTC here needs a non-loopback interface)")
    return "\r\n".join(lines) + "\r\n", real


class RtcSession:
    """One conversation over WebRTC through `relay`: the microphone track says each prompt after the last reply."""

    def __init__(self, http: str, up: Link, down: Link, persona: str | None = None) -> None:
        self.http, self.up, self.down, self.persona = http, up, down, persona
        self.messages: list[dict[str, Any]] = []
        self.frames: list[tuple[float, int, float]] = []  # (arrival, pts, rms) of the reply track
        self.queue = np.zeros(0, dtype=np.float32)
        self.voiced_end: tuple[int, float | None] = (0, None)  # (samples left when speech ends, when it was sent)
        self.loop_lag_ms = 0.0  # the client's own event loop, at its latest

    async def run(self, prompts: list[Prompt]) -> list[dict[str, Any]]:
        import av
        import httpx
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
        from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

        from voice.audio import resample

        session = self

        class Mic(MediaStreamTrack):
            kind = "audio"
            start, pts = None, 0

            async def recv(self) -> av.AudioFrame:
                if self.start is None:
                    self.start = time.monotonic()
                else:
                    self.pts += FRAME
                    await asyncio.sleep(max(0.0, self.start + self.pts / OPUS_RATE - time.monotonic()))
                chunk = np.zeros(FRAME, np.float32)
                n = min(FRAME, len(session.queue))
                chunk[:n], session.queue = session.queue[:n], session.queue[n:]
                left, sent = session.voiced_end
                if sent is None and len(session.queue) <= left:
                    session.voiced_end = (left, time.monotonic())
                frame = av.AudioFrame.from_ndarray((chunk * 32767).astype(np.int16).reshape(1, -1), format="s16", layout="mono")
                frame.sample_rate, frame.pts, frame.time_base = OPUS_RATE, self.pts, fractions.Fraction(1, OPUS_RATE)
                return frame

        async def record(track: Any) -> None:
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                pcm = frame.to_ndarray().astype(np.float32) / 32768.0
                self.frames.append((time.monotonic(), int(frame.pts or 0), float(np.sqrt(np.mean(pcm**2)))))

        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTrack(Mic())
        channel = pc.createDataChannel("parley")

        def on_message(raw: Any) -> None:
            if isinstance(raw, str):
                self.messages.append({**json.loads(raw), "at": time.monotonic()})

        channel.on("message", on_message)
        tasks: list[asyncio.Task[None]] = []
        pc.on("track", lambda track: tasks.append(asyncio.create_task(record(track))))
        await pc.setLocalDescription(await pc.createOffer())
        host = next(m.group(5) for line in pc.localDescription.sdp.splitlines()
                    if (m := _CANDIDATE.match(line)) and ":" not in m.group(5))  # fmt: skip
        relay = await UdpRelay(host, self.up, self.down).start()
        offer, relay.client = _relayed(pc.localDescription.sdp, relay.port("b"))
        async with httpx.AsyncClient(base_url=self.http, timeout=30) as http:
            answer = (await http.post("/webrtc/offer", json={"type": "offer", "sdp": offer})).json()
        sdp, relay.server = _relayed(answer["sdp"], relay.port("a"))
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
        skip_lost_packets(pc)  # the server's fix to aiortc's receiver, here too: a loss is not a 300 ms stall
        tasks.append(asyncio.create_task(self._watch_loop()))

        async def wait(cond: Any, timeout_s: float = 90.0) -> None:
            async with asyncio.timeout(timeout_s):
                while not cond():
                    await asyncio.sleep(0.02)  # frames arrive every 20 ms: polled, not signalled

        results = []
        try:
            await wait(lambda: channel.readyState == "open", 60)
            start = {"type": "session.start", "protocol": 1, **({"persona": self.persona} if self.persona else {})}
            channel.send(json.dumps(start))
            await wait(lambda: any(m["type"] == "response.done" for m in self.messages))  # the greeting
            await self._quiet(wait)
            for prompt in prompts:
                results.append(await self._turn(prompt, wait, resample))
        finally:
            for task in tasks:
                task.cancel()
            await pc.close()
            relay.close()
        return results

    async def _watch_loop(self, period_s: float = 0.01) -> None:
        """How late this client's own event loop runs (a late loop here reads as a stall it did not hear)."""
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(period_s)
            self.loop_lag_ms = max(self.loop_lag_ms, 1000.0 * (time.monotonic() - t0 - period_s))

    async def _quiet(self, wait: Any, seconds: float = 0.8) -> None:
        def quiet() -> bool:
            run = 0.0
            for _, _, rms in reversed(self.frames):
                if rms >= AUDIBLE_RMS:
                    break
                run += FRAME / OPUS_RATE
            return run >= seconds

        await wait(quiet)

    async def _turn(self, prompt: Prompt, wait: Any, resample: Any) -> dict[str, Any]:
        done_before = sum(m["type"] == "response.done" for m in self.messages)
        finals_before = sum(m["type"] == "transcript.final" for m in self.messages)
        speech = resample(prompt.audio, 16000, OPUS_RATE)
        self.voiced_end = (len(speech) - int(prompt.speech_end_ms * OPUS_RATE / 1000), None)
        self.queue = np.concatenate([self.queue, speech])
        await wait(lambda: sum(m["type"] == "response.done" for m in self.messages) > done_before
                   and sum(m["type"] == "transcript.final" for m in self.messages) > finals_before)  # fmt: skip
        await self._quiet(wait)
        sent = self.voiced_end[1]
        reply = [f for f in self.frames if sent is not None and f[0] > sent]
        audible = [i for i, f in enumerate(reply) if f[2] >= AUDIBLE_RMS]
        v2v = lost = stall = None
        if audible and sent is not None:
            span = reply[audible[0] : audible[-1] + 1]
            v2v = 1000.0 * (span[0][0] - sent)
            lost = sum(max(0, (b[1] - a[1]) // FRAME - 1) for a, b in zip(span, span[1:])) * 1000.0 * FRAME / OPUS_RATE
            stall, play_until, last_pts = 0.0, span[0][0], span[0][1] - FRAME
            for at, pts, _ in span:  # played as it arrives: a frame later than the one before has played out is a
                due = play_until + max(0, pts - last_pts - FRAME) / OPUS_RATE  # stall; a lost one is concealed
                stall = max(stall, at - due)
                play_until, last_pts = max(due, at) + FRAME / OPUS_RATE, pts
            stall *= 1000.0
        final = [m for m in self.messages if m["type"] == "transcript.final"][-1]["text"]
        lag, self.loop_lag_ms = self.loop_lag_ms, 0.0
        return {"prompt": prompt.text, "transcript": final, "v2v_ms": v2v, "stall_ms": stall, "lost_ms": lost,
                "client_lag_ms": lag}  # fmt: skip


async def ws_conversation(url: str, up: Link, down: Link, prompts: list[Prompt],
                          persona: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    host, port = url.removeprefix("http://").split(":")
    proxy = await TcpProxy((host, int(port)), up, down).start()
    try:
        session = ScriptedSession(f"127.0.0.1:{proxy.port}", persona=persona, turn_timeout_s=90.0)
        turns = await session.run(prompts)
    finally:
        proxy.close()
    return [{"prompt": t.prompt, "transcript": t.transcript, "v2v_ms": t.client_v2v_ms, "stall_ms": t.reply_gap_ms,
             "lost_ms": 0.0, "error": t.error} for t in turns]  # fmt: skip


def summary(turns: list[dict[str, Any]], up: Link, down: Link) -> dict[str, Any]:
    pick = lambda key: [t[key] for t in turns if t.get(key) is not None]  # noqa: E731
    v2v, stall = pick("v2v_ms"), pick("stall_ms")
    return {"turns": len(turns), "v2v_p50": _stats.percentile(v2v, 50) if v2v else None,
            "stall_max": max(stall) if stall else None, "lost_ms": sum(pick("lost_ms")),
            "wer": wer([t["prompt"] for t in turns], [t["transcript"] for t in turns]),
            "packets_lost": f"{up.lost + down.lost}/{up.packets + down.packets}",
            "client_lag_max": max(pick("client_lag_ms"), default=None)}  # fmt: skip


async def bench(url: str, losses: list[float], prompts: list[Prompt], delay_ms: float, jitter_ms: float, seed: int,
                persona: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for loss in losses:
        for transport in ("websocket", "webrtc"):
            up, down = (Link(loss / 100, delay_ms, jitter_ms, seed + k) for k in (1, 2))
            t0 = time.monotonic()
            if transport == "websocket":
                turns = await ws_conversation(url, up, down, prompts, persona)
            else:
                turns = await RtcSession(url, up, down, persona).run(prompts)
            rows.append({"transport": transport, "loss_pct": loss, **summary(turns, up, down), "detail": turns})
            print(f"  {transport} at {loss:g} % loss: {time.monotonic() - t0:.0f} s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loss", default="0,2,5", help="loss rates in percent, each way")
    p.add_argument("--delay-ms", type=float, default=40.0)
    p.add_argument("--jitter-ms", type=float, default=20.0)
    p.add_argument("--turns", type=int, default=4, help="spoken turns per conversation")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default="artifacts/bench/network.json")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--persona", help="persona to talk to (default: the server's; --tiny: concise, short replies)")
    p.add_argument("--tiny", action="store_true", help="one turn over each transport at 5 % loss, the concise persona")
    p.add_argument("--server", help="a running server's URL (default: start `parley serve` on the embedded models)")
    args = p.parse_args(argv)
    if args.tiny:
        args.turns, args.loss, args.persona = 1, "5", args.persona or "concise"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prompts = corpus_prompts(args.turns, voices=("piper",))
    server = None if args.server else start_server(out.parent / "network-traces.jsonl", out.parent / "network-server.log")
    try:
        url = args.server or server.url  # type: ignore[union-attr]
        rows = asyncio.run(bench(url, [float(x) for x in args.loss.split(",")], prompts, args.delay_ms, args.jitter_ms,
                                 args.seed, args.persona))  # fmt: skip
    finally:
        if server is not None:
            server.stop()
    f = _stats.fmt_ms
    table = _stats.markdown if args.markdown else _stats.table
    print(f"\nLossy link: {args.delay_ms:g} ms ± {args.jitter_ms:g} ms each way, seed {args.seed}, {args.turns} turns")
    print(table(("transport", "loss", "voice-to-voice p50 ms", "longest stall ms", "reply audio lost ms", "user WER",
                 "packets lost", "client loop late ms"), [[r["transport"], f"{r['loss_pct']:g} %", f(r["v2v_p50"]),
                 f(r["stall_max"]), f(r["lost_ms"]), "-" if r["wer"] is None else f"{100 * r['wer']:.1f} %",
                 r["packets_lost"], f(r["client_lag_max"])] for r in rows]))  # fmt: skip
    out.write_text(json.dumps({"argv": sys.argv[1:] if argv is None else argv, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
