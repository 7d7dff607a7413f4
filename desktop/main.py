"""`parley client`: flags -> a DesktopClient on the local microphone and speakers, shown with rich.

Thin shell: parses flags, picks devices, turns every expected failure (no device, server
unreachable, token rejected) into one clear line and exit code 1. The cores live in desktop/.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from parley.config import AppConfig


def _parser(cfg: AppConfig) -> argparse.ArgumentParser:
    host = "127.0.0.1" if cfg.server.host in ("0.0.0.0", "::") else cfg.server.host
    p = argparse.ArgumentParser(prog="parley client", description="Talk to a Parley server with this machine's "
                                "microphone and speakers.")
    p.add_argument("--server", default=f"{host}:{cfg.server.port}",
                   help="HOST:PORT or ws(s)://HOST:PORT/ws (default: %(default)s)")
    p.add_argument("--token", default=cfg.server.token, help="the server's access token, if it needs one")
    p.add_argument("--persona", help=f"persona ({', '.join(cfg.personas)}; default: the server's)")
    p.add_argument("--voice", help=f"voice ({', '.join(cfg.voices)}; default: the persona's)")
    p.add_argument("--input-device", help="microphone: index or part of the name (see --list-devices)")
    p.add_argument("--output-device", help="speaker: index or part of the name")
    p.add_argument("--list-devices", action="store_true", help="list audio devices and exit")
    p.add_argument("--push-to-talk", action="store_true", help="send the microphone only while talking "
                   "(space starts and stops)")
    p.add_argument("--headphones", action="store_true", help="no echo handling: the microphone cannot hear "
                   "the speaker")
    p.add_argument("--echo", choices=("auto", "aec", "guard", "off"), default="auto",
                   help="echo handling: aec (WebRTC AEC3, needs pywebrtc-audio), guard (half-duplex), off; "
                   "auto = aec if installed, else guard (default)")
    return p


def list_devices_text() -> str:
    from desktop.audio_io import list_devices

    devices = list_devices()
    if not devices:
        return ("No audio devices found.\nHint: PortAudio sees no sound card here. Plug in a microphone and "
                "speakers, check that your user may use them (e.g. the 'audio' group, PulseAudio/PipeWire "
                "running), or use the browser client instead.")
    lines = ["  #  in out   rate  name"]
    for d in devices:
        lines.append(f"{d.index:3d} {d.max_input_channels:3d} {d.max_output_channels:3d} "
                     f"{d.default_sample_rate:6.0f}  {d.name}")
    return "\n".join(lines)


def main(cfg: AppConfig, rest_args: Sequence[str]) -> int:
    args = _parser(cfg).parse_args(list(rest_args))
    if args.list_devices:
        print(list_devices_text())
        return 0
    from desktop.app import ClientOptions, DesktopClient
    from desktop.audio_io import NoAudioDevice, SoundDeviceIO
    from desktop.connection import ws_url
    from desktop.echo import EchoMode, aec_available

    try:
        url = ws_url(args.server)
    except ValueError as exc:
        print(f"parley client: {exc}", file=sys.stderr)
        return 2
    if args.persona and args.persona not in cfg.personas:
        print(f"parley client: note: {args.persona!r} is not a persona in the local config; "
              "the server decides", file=sys.stderr)
    echo: EchoMode | Literal["auto"] = "off" if args.headphones else args.echo
    if echo == "aec" and not aec_available():
        print("parley client: --echo aec needs the pywebrtc-audio package (pip install pywebrtc-audio)",
              file=sys.stderr)
        return 2
    try:
        audio = SoundDeviceIO(args.input_device, args.output_device)
    except NoAudioDevice as exc:
        print(f"parley client: {exc}", file=sys.stderr)
        return 1
    opts = ClientOptions(url=url, token=args.token, persona=args.persona, voice=args.voice,
                         push_to_talk=args.push_to_talk, echo=echo, user=_user_id())
    client = DesktopClient(opts, audio)
    try:
        return asyncio.run(run_with_terminal(client))
    except KeyboardInterrupt:
        return 0


def _user_id() -> str | None:
    """This computer's user, as a persona with memory knows them: a random id made once, kept in the user's config
    directory (None where it cannot be kept: nothing is remembered)."""
    import secrets

    from platformdirs import user_config_dir

    path = Path(user_config_dir("parley")) / "user-id"
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_hex(12))
        return path.read_text().strip() or None
    except OSError:
        return None


def _stop_on_signals(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> list[signal.Signals]:
    """Ctrl-C and SIGTERM end the client cleanly (devices closed, latency table printed)."""
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
            continue
        installed.append(sig)
    return installed


async def run_with_terminal(client: object) -> int:
    """Runs the client under a rich live view with single-key commands; prints the latency table
    at the end, and the reason when it could not connect."""
    from rich.console import Console
    from rich.live import Live

    from desktop.app import DesktopClient
    from desktop.keys import key_reader
    from desktop.tui import print_latency, render

    assert isinstance(client, DesktopClient)
    console = Console()
    loop = asyncio.get_running_loop()

    def on_key(key: str) -> None:
        if key == "q":
            client.stop()
        elif key == " " and client.opts.push_to_talk:
            client.set_talking(not client.talking)
        elif key == "i":
            asyncio.ensure_future(client.interrupt())
        elif key == "p":
            asyncio.ensure_future(client.next_persona())

    async def refresh(live: Live) -> None:
        while True:
            live.update(render(client.view))
            await asyncio.sleep(0.125)

    stops = _stop_on_signals(loop, client.stop)
    with key_reader(loop, on_key), Live(render(client.view), console=console, transient=False,
                                        auto_refresh=False) as live:
        painter = asyncio.create_task(refresh(live))
        try:
            code = await client.run()
        finally:
            painter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await painter
            live.update(render(client.view), refresh=True)
            for sig in stops:
                loop.remove_signal_handler(sig)
    if code:
        console.print(f"parley client: {client.view.notice}", style="red")
    elif client.view.turns:
        print_latency(console, client.view)
    return code
