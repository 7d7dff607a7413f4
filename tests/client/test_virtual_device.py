"""The real sounddevice path, through a PulseAudio null sink reached by ALSA's pulse plugin.

A private PulseAudio daemon gets two null sinks: `parley_mic` (we play speech into it; its monitor
is the default source, i.e. the client's microphone) and `parley_out` (the default sink, i.e. the
client's speaker; we record its monitor). Skipped when pulseaudio is not installed.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from bench._pulse import private_pulseaudio
from support.mock_server import MockState, port_of, start_mock
from support.sounds import speechlike
from support.waiting import wait_for

NEEDED = ("pulseaudio", "pactl", "paplay", "parecord")
pytestmark = pytest.mark.skipif(any(shutil.which(b) is None for b in NEEDED),
                                reason="needs pulseaudio, pulseaudio-utils and libasound2-plugins")

CLIENT = """
import sys
from parley.config import load_config
from desktop.main import main
sys.exit(main(load_config(), sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def pulse_env() -> Iterator[dict[str, str]]:
    with private_pulseaudio() as env:
        full = {**os.environ, **env}
        full.pop("PULSE_SERVER", None)
        yield full


def test_list_devices_sees_the_virtual_device(pulse_env: dict[str, str]) -> None:
    out = subprocess.run([sys.executable, "-c", CLIENT, "--list-devices"], env=pulse_env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    assert any(line.split()[-1] in ("pulse", "default") for line in out.stdout.splitlines()[1:])


async def test_turn_through_real_sounddevice_streams(pulse_env: dict[str, str], tmp_path: Path) -> None:
    state = MockState(reply_s=1.5)
    server = await start_mock(state)
    speech = tmp_path / "speech.wav"
    sf.write(speech, np.concatenate([speechlike(0.8, 44100), np.zeros(44100, np.float32)]), 44100)
    heard = tmp_path / "heard.wav"
    recorder = subprocess.Popen(["parecord", "--device=parley_out.monitor", "--file-format=wav", str(heard)],
                                env=pulse_env)
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, "--server", f"127.0.0.1:{port_of(server)}", "--headphones",
        env={**pulse_env, "COLUMNS": "120"}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await wait_for(lambda: state.sessions == 1, 30, "client session")
        await asyncio.sleep(0.5)
        player = await asyncio.create_subprocess_exec("paplay", "--device=parley_mic", str(speech), env=pulse_env)
        await player.wait()
        await wait_for(lambda: any(t == 1 and ms >= 1499 for t, ms in state.marks), 30, "reply played")
        await asyncio.sleep(0.5)  # the device's own buffer still holds the last blocks
        client.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(client.communicate(), 20)
    finally:
        if client.returncode is None:
            client.kill()
        recorder.terminate()
        recorder.wait(10)
        server.close()
        await server.wait_closed()
    assert client.returncode == 0, err.decode()
    text = out.decode()
    assert "what is" in text and "1453" in text and "mic→ear" in text  # the table printed at exit
    assert state.audio_bytes > 16000 * 2  # > 1 s of microphone audio reached the server
    rec, rate = sf.read(heard, dtype="float32", always_2d=True)
    tone = rec.mean(axis=1)
    spectrum = np.abs(np.fft.rfft(tone))
    peak_hz = np.argmax(spectrum) * rate / len(tone)
    assert abs(peak_hz - 220.0) < 5.0  # the mock's 220 Hz reply (voice joe) came out of the speaker
    # |0.3 sin| > 0.05 for 89% of the time: all 1.5 s of the tone played once -> ~1.34 s
    assert 1.25 < np.count_nonzero(np.abs(tone) > 0.05) / rate < 1.45
