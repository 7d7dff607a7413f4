"""The clients' own share of the latency: per reply, from its first audio message arriving to its first sample
played, in the browser (headless Chromium, its AudioWorklet player) and in the desktop client (its jitter buffer
and output stream), against one real server; underruns counted; prints a table and writes a JSON file.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.client_playback [--server URL] [--turns 8] [--tiny]

Typed turns (no speech to recognise: what the clients do is measured, not the server). `desktop` plays into a fake
sound card (output latency 0: its number is what the client itself adds); `desktop-pulse` through a real PortAudio
stream (sounddevice, ALSA's pulse plugin) into a private PulseAudio null sink, its reported output latency included
(`--pulse-latency high` opens it as sounddevice does by default, as the client did before). The browser's number is to
the output, its reported latency (baseLatency + outputLatency) included.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import _pulse, _stats
from bench._server import machine, start_server
from bench.corpus import REQUESTS

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
]
HEADER = ["client", "replies", "first reply ms", "median ms", "p95 ms", "max ms", "client part median ms",
          "output latency ms", "underruns", "in server trace"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", help="URL of a running server (default: start `parley serve` on a free port)")
    p.add_argument("--turns", type=int, default=8, help="typed turns per client (default 8)")
    p.add_argument("--persona", default="concise", help="persona to talk to (default concise: short replies)")
    p.add_argument("--clients", default="browser,desktop", help="which clients to measure, of browser, desktop and "
                   "desktop-pulse (default browser,desktop)")
    p.add_argument("--pulse-latency", default="low", help="desktop-pulse: the output stream's latency (default low)")
    p.add_argument("--prebuffer-ms", type=float, default=0.0,
                   help="the desktop jitter buffer's starting target (default 0: play the first message at once)")
    p.add_argument("--turn-timeout", type=float, default=120.0, help="seconds a turn may take (default 120)")
    p.add_argument("--out", default="artifacts/bench/client_playback.json", help="JSON results (default %(default)s)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (for docs/benchmarks.md)")
    p.add_argument("--tiny", action="store_true", help="two turns per client: a smoke test")
    args = p.parse_args(argv)
    if args.tiny:
        args.turns = 2
    return args


def server_traces(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url.rstrip("/") + "/api/traces?limit=500", timeout=10) as r:
        return list(json.loads(r.read())["traces"])


# ---- browser ----------------------------------------------------------------------------------------------------

def browser_replies(url: str, texts: list[str], persona: str, timeout_s: float) -> tuple[list[dict[str, Any]], str]:
    """Each reply's playback start as the page measured it: [{turn_id, start_ms, render_ms, output_latency_ms,
    underruns}], and the session id."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(permissions=["microphone"])
            context.add_init_script("localStorage.setItem('parley.transport', 'ws');"  # the socket: the player plays
                                    f"localStorage.setItem('parley.choice', JSON.stringify({{persona: {json.dumps(persona)}}}))")
            page = context.new_page()
            page.goto(url)
            page.wait_for_selector("#conn[data-phase=up]", timeout=60_000)
            wait_ms = timeout_s * 1000
            page.wait_for_function("window.parleyStats.done.length >= 1 && window.parley.player.idle", timeout=wait_ms)
            for n, text in enumerate(texts, start=2):  # the greeting was reply 1
                page.fill("#text", text)
                page.press("#text", "Enter")
                page.wait_for_function(f"window.parleyStats.done.length >= {n} && window.parley.player.idle", timeout=wait_ms)
                print(f"  browser turn {n - 1}/{len(texts)}", flush=True)
            s = page.evaluate("JSON.parse(JSON.stringify(window.parleyStats))")
        finally:
            browser.close()
    rows = [{"turn_id": int(t), "start_ms": v["startMs"], "render_ms": v["renderMs"],
             "output_latency_ms": v["outputLatencyMs"], "underruns": int(s["underruns"].get(t, 0)), "clock": v["clock"]}
            for t, v in sorted(s["playbackStart"].items(), key=lambda kv: int(kv[0]))]
    return rows, str(s["sessionId"])


# ---- desktop ----------------------------------------------------------------------------------------------------

async def desktop_replies(url: str, texts: list[str], persona: str, prebuffer_ms: float, timeout_s: float,
                          pulse_latency: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """The same from the desktop client, on a fake sound card or (pulse_latency given) the default PortAudio devices."""
    from desktop.app import ClientOptions, DesktopClient
    from desktop.audio_io import ArrayAudioIO, AudioIO, SoundDeviceIO

    audio: AudioIO = ArrayAudioIO(input_rate=48000, output_rate=48000) if pulse_latency is None else \
        SoundDeviceIO(output_latency=pulse_latency)
    from desktop.connection import ws_url

    opts = ClientOptions(url=ws_url(url), persona=persona, echo="off", prebuffer_ms=prebuffer_ms)
    client = DesktopClient(opts, audio)
    task = asyncio.create_task(client.run())

    async def until(cond: Any, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if task.done() or time.monotonic() > deadline:
                raise RuntimeError(f"desktop client: no {what} (client ended: {task.done()})")
            await asyncio.sleep(0.02)

    def done_count() -> int:
        return sum(1 for e in client.events if e.get("type") == "response.done")

    try:
        await until(client.ready.is_set, "session")
        await until(lambda: done_count() >= 1 and not client.jitter.playing(), "greeting")
        for n, text in enumerate(texts, start=2):
            await client.send_text(text)
            await until(lambda: done_count() >= n and not client.jitter.playing(), f"reply {n - 1}")
            print(f"  desktop turn {n - 1}/{len(texts)}", flush=True)
        await asyncio.sleep(2 * client.opts.mark_interval_ms / 1000)  # the last turn's marks reach the server
    finally:
        client.stop()
        await asyncio.wait_for(task, 10)
    rows = [{"turn_id": r.turn_id, "start_ms": r.client_playback_ms, "render_ms": None if r.client_playback_ms is None
             else r.client_playback_ms - (r.output_latency_ms or 0.0), "output_latency_ms": r.output_latency_ms,
             "underruns": r.underruns} for r in client.latency.rows() if r.client_playback_ms is not None]
    return rows, client.info.session_id if client.info else ""


def pulse_replies(url: str, texts: list[str], args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    if not _pulse.available():
        raise SystemExit("desktop-pulse needs pulseaudio and pactl (apt-get install pulseaudio pulseaudio-utils "
                         "libasound2-plugins)")
    with _pulse.private_pulseaudio() as env:
        os.environ.update(env)  # before PortAudio starts (sounddevice is first imported below)
        return asyncio.run(desktop_replies(url, texts, args.persona, args.prebuffer_ms, args.turn_timeout,
                                           args.pulse_latency))


# ---- report -----------------------------------------------------------------------------------------------------

def summarize(rows: list[dict[str, Any]], traced: int) -> dict[str, Any]:
    """The first reply (the greeting: the audio output has only just started) apart; median, p95, max over the rest."""
    rows = sorted(rows, key=lambda r: r["turn_id"])
    first, rest = (rows[0], rows[1:]) if rows else (None, [])
    starts = [float(r["start_ms"]) for r in rest if r["start_ms"] is not None]
    parts = [float(r["render_ms"]) for r in rest if r["render_ms"] is not None]
    latency = [float(r["output_latency_ms"]) for r in rows if r["output_latency_ms"] is not None]
    return {
        "replies": len(rows),
        "first_ms": None if first is None else first["start_ms"],
        "n": len(starts),
        "median_ms": _stats.percentile(starts, 50) if starts else None,
        "p95_ms": _stats.percentile(starts, 95) if starts else None,
        "max_ms": max(starts, default=None),
        "client_part_median_ms": _stats.percentile(parts, 50) if parts else None,
        "output_latency_ms": _stats.percentile(latency, 50) if latency else None,
        "underruns": sum(int(r["underruns"]) for r in rows),
        "in_server_trace": traced,
    }


def traced_count(traces: list[dict[str, Any]], session_id: str) -> int:
    """The session's turn traces that carry the client's own playback start (sent on its first playback.mark)."""
    return sum(1 for t in traces if t.get("session_id") == session_id and "client_playback_ms" in t)


def row(name: str, s: dict[str, Any]) -> list[object]:
    return [name, s["replies"], _stats.fmt_ms(s["first_ms"]), _stats.fmt_ms(s["median_ms"]), _stats.fmt_ms(s["p95_ms"]), _stats.fmt_ms(s["max_ms"]),
            _stats.fmt_ms(s["client_part_median_ms"]), _stats.fmt_ms(s["output_latency_ms"]), s["underruns"],
            s["in_server_trace"]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    texts = [REQUESTS[i % len(REQUESTS)] for i in range(args.turns)]
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    server = None
    url = args.server
    if url is None:  # (a page the server serves itself is allowed whatever the port)
        logs = Path("artifacts/bench")
        logs.mkdir(parents=True, exist_ok=True)
        server = start_server(logs / f"{out.stem}.traces.jsonl", logs / f"{out.stem}.server.log")
        url = server.url
        print(f"started parley serve at {url}", flush=True)
    results: dict[str, Any] = {"machine": machine(), "turns": args.turns, "persona": args.persona, "clients": {}}
    try:
        for name in clients:
            if name == "browser":
                rows, session = browser_replies(url, texts, args.persona, args.turn_timeout)
            elif name == "desktop":
                rows, session = asyncio.run(desktop_replies(url, texts, args.persona, args.prebuffer_ms, args.turn_timeout))
            elif name == "desktop-pulse":
                rows, session = pulse_replies(url, texts, args)
            else:
                raise SystemExit(f"unknown client {name!r}: browser or desktop")
            summary = summarize(rows, traced_count(server_traces(url), session))
            results["clients"][name] = {"summary": summary, "replies": rows}
    finally:
        if server is not None:
            server.stop()
    body = [row(name, r["summary"]) for name, r in results["clients"].items()]
    print((_stats.markdown if args.markdown else _stats.table)(HEADER, body))
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
