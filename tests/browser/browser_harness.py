"""Browser-test helpers: chromium flags, fake-microphone WAVs, the mock server in a subprocess.

Servers run as subprocesses (the mock here; the real one through bench/parley_process.py, as `make run` starts it)
and are served from 127.0.0.1 so AudioWorklets load (secure context). Knows nothing of pytest fixtures.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import soxr

from bench import corpus as audio_corpus
from bench.parley_process import ParleyProcess

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
FAKE_MIC_RATE = 44100  # Chromium's fake capture device runs at 44.1 kHz stereo
ARTIFACTS = ROOT / "artifacts" / "browser"


def chromium_args(wav: Path | None) -> list[str]:
    args = [
        "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
    ]
    if wav is not None:
        args.append(f"--use-file-for-fake-audio-capture={wav}")
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mic_wav(path: Path, parts: list[tuple[str, float | str]]) -> Path:
    """Write a fake-mic WAV from ("silence", ms), ("tone", ms) and ("say", text) parts, as 44.1 kHz stereo PCM16.

    The fake device loops the file, so callers end it with a long silence.
    """
    pieces: list[np.ndarray] = []
    for kind, value in parts:
        if kind == "silence":
            pieces.append(audio_corpus.silence(float(value), FAKE_MIC_RATE))
        elif kind == "tone":  # a short loud blip (a cough stand-in), `value` ms of 300 Hz
            t = np.arange(int(float(value) * FAKE_MIC_RATE / 1000)) / FAKE_MIC_RATE
            pieces.append((0.4 * np.sin(2 * np.pi * 300 * t)).astype(np.float32))
        else:
            audio, rate = audio_corpus.speak_piper(str(value))
            pieces.append(soxr.resample(audio, rate, FAKE_MIC_RATE).astype(np.float32) * 0.9)
    mono = np.concatenate(pieces)  # [N]
    import soundfile as sf

    sf.write(path, np.stack([mono, mono], axis=1), FAKE_MIC_RATE, subtype="PCM_16")
    return path


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}; its log ends:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


class MockProcess:
    """The mock server (tests/support/mock_server.py) in a subprocess that can be killed and started again on the
    same port."""

    def __init__(self, argv: list[str], port: int, log: Path, ready_timeout_s: float) -> None:
        self.argv = argv
        self.port = port
        self.log = log
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{port}/"

    def start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        out = self.log.open("a")
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        wait_http(self.url + "healthz", self.proc, self.ready_timeout_s, self.log)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""


def mock_server(tmp_path: Path, options: str = "{}") -> MockProcess:
    port = free_port()
    argv = [sys.executable, "-m", "tests.support.mock_server", str(port), options]
    return MockProcess(argv, port, tmp_path / "mock.log", ready_timeout_s=30)


Server = MockProcess | ParleyProcess  # what a page talks to: the mock, or the real server


def page_stats(page) -> dict:
    """The page's own numbers (window.parleyStats) as plain Python data."""
    return page.evaluate("JSON.parse(JSON.stringify(window.parleyStats))")


def wait_page(page, expression: str, timeout_ms: float, server: Server | None = None) -> None:
    """wait_for_function that, on timeout, fails with the page's numbers and the server log's end."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(expression, timeout=timeout_ms)
    except PlaywrightTimeout:
        s = page_stats(page)
        for key in ("firstPlayed", "micToEar", "turnAudio"):
            s[key] = dict(list(s.get(key, {}).items())[-6:])
        convo = page.inner_text("#conversation")[-1500:]
        raise AssertionError(f"waited {timeout_ms / 1000:.0f} s for {expression}\npage stats: {s}\n"
                             f"conversation: {convo}\nserver log: {server.log_tail(20) if server else ''}") from None


def restart_and_expect_reconnect(page, server: Server, reconnect_timeout_ms: float) -> None:
    """Kill the server under a connected page, check the page says so, restart it, check the same page
    (no reload: a marker survives) is back on a new session with the error gone."""
    first = page_stats(page)["sessionId"]
    page.evaluate("window.parleyLoadMarker = 42")
    server.kill()
    page.wait_for_selector("#error:not([hidden])", timeout=30_000)
    assert "Lost the connection" in page.inner_text("#error")
    assert page.get_attribute("#state", "data-state") == "offline"
    server.start()
    page.wait_for_selector("#conn[data-phase=up]", timeout=reconnect_timeout_ms)
    assert page.is_hidden("#error")
    assert page.evaluate("window.parleyLoadMarker") == 42
    assert page_stats(page)["sessionId"] != first
