"""`parley client` as a user meets it: device listing, no device, unreachable server, the table at exit."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from support.mock_server import MockState, port_of, start_mock
from support.sounds import speechlike
from support.waiting import wait_for
from desktop import main as client_cli
from desktop import audio_io
from desktop.app import ClientOptions, DesktopClient
from desktop.audio_io import ArrayAudioIO, DeviceInfo
from parley.config import load_config


@pytest.fixture(scope="module")
def cfg():  # type: ignore[no-untyped-def]
    return load_config()


def test_list_devices_without_devices_gives_a_hint(cfg, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(audio_io, "list_devices", lambda: [])
    assert client_cli.main(cfg, ["--list-devices"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No audio devices found.") and "Hint:" in out


def test_list_devices_prints_a_row_per_device(cfg, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(audio_io, "list_devices",
                        lambda: [DeviceInfo(0, "USB Mic", 1, 0, 48000.0), DeviceInfo(3, "Speakers", 0, 2, 44100.0)])
    assert client_cli.main(cfg, ["--list-devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["0", "1", "0", "48000", "USB", "Mic"]
    assert lines[2].split() == ["3", "0", "2", "44100", "Speakers"]


def test_no_device_is_a_clear_message_not_a_traceback(cfg, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(audio_io, "list_devices", lambda: [])
    assert client_cli.main(cfg, ["--server", "127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("parley client: no audio input device found.") and "Traceback" not in err


def test_device_chosen_by_name_or_index(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    devices = [DeviceInfo(0, "USB Mic", 1, 0, 48000.0), DeviceInfo(3, "Speakers", 0, 2, 44100.0)]
    assert audio_io._pick(devices, "usb", "input").index == 0
    assert audio_io._pick(devices, "3", "output").name == "Speakers"
    with pytest.raises(audio_io.NoAudioDevice, match="no audio output device matches 'hdmi'"):
        audio_io._pick(devices, "hdmi", "output")


# The real `parley client` command in a child process whose `sounddevice` is a fake sound card holding `devices`
# (PortAudio's device dicts): streams that open, start and stop, and never call back. Both branches of what the
# machine has are driven on every machine; tests/client/test_virtual_device.py plays through a real (virtual) card.
FAKE_SOUND_CARD = """
import sys, types
sd = types.ModuleType("sounddevice")
devices = {devices!r}
sd.query_devices = lambda: [dict(d) for d in devices]
sd.default = types.SimpleNamespace(device=[0, 0] if devices else [-1, -1])
class Stream:
    latency = 0.01
    def __init__(self, **kw): pass
    def start(self): pass
    def stop(self): pass
    def close(self): pass
sd.InputStream = sd.OutputStream = Stream
sys.modules["sounddevice"] = sd
from cli.main import main
sys.exit(main(["client", "--server", "127.0.0.1:9"]))
"""
HEADSET = {"index": 0, "name": "Fake headset", "max_input_channels": 1, "max_output_channels": 2,
           "default_samplerate": 48000.0}


def parley_client_with(devices: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", FAKE_SOUND_CARD.format(devices=devices)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_parley_client_command_without_a_sound_card_is_one_clear_line() -> None:
    proc = parley_client_with([])
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.stderr.startswith("parley client: no audio input device found"), proc.stderr


def test_parley_client_command_with_a_sound_card_and_no_server_is_one_clear_line() -> None:
    proc = parley_client_with([HEADSET])
    out = (proc.stdout + proc.stderr).replace("\n", "")
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert "parley client: cannot reach a Parley server at ws://127.0.0.1:9/ws" in out


async def test_terminal_run_reports_unreachable_server(capsys) -> None:  # type: ignore[no-untyped-def]
    client = DesktopClient(ClientOptions(url="ws://127.0.0.1:9/ws", echo="off"), ArrayAudioIO())
    assert await client_cli.run_with_terminal(client) == 1
    out = capsys.readouterr().out
    assert "parley client: cannot reach a Parley server at ws://127.0.0.1:9/ws" in out.replace("\n", "")


async def test_terminal_run_prints_the_latency_table_at_exit(capsys) -> None:  # type: ignore[no-untyped-def]
    state = MockState()
    server = await start_mock(state)
    try:
        audio = ArrayAudioIO()
        client = DesktopClient(ClientOptions(url=f"ws://127.0.0.1:{port_of(server)}/ws", echo="guard"), audio)
        task = asyncio.create_task(client_cli.run_with_terminal(client))
        await wait_for(client.ready.is_set, what="ready")
        audio.say(speechlike(0.6), 16000)
        await wait_for(lambda: bool(client.view.turns) and bool(client.view.turns[-1].stages_ms), what="trace")
        client.stop()
        assert await asyncio.wait_for(task, 5) == 0
    finally:
        server.close()
        await server.wait_closed()
    out = capsys.readouterr().out
    table = out[out.rindex("latency per turn (ms)"):]
    assert "v2v" in table and "1453" in table and "mic→ear" in table and "what is" in table
