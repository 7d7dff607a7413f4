"""A private PulseAudio daemon with two null sinks, so a real PortAudio stream (sounddevice, through ALSA's pulse
plugin) has devices on a machine without a sound card: `parley_out` is the default sink (the speaker), the monitor of
`parley_mic` the default source (the microphone). Knows nothing of Parley."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NEEDED = ("pulseaudio", "pactl")


def available() -> bool:
    return all(shutil.which(b) is not None for b in NEEDED)


@contextmanager
def private_pulseaudio() -> Iterator[dict[str, str]]:
    """Start the daemon; yields the environment variables that reach it (set them before PortAudio starts)."""
    runtime = Path(f"/tmp/parley-pulse-bench-{os.getpid()}")  # short: a unix socket path has a length limit
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {"XDG_RUNTIME_DIR": str(runtime), "PULSE_RUNTIME_PATH": str(runtime / "pulse")}
    full = {**os.environ, **env}
    full.pop("PULSE_SERVER", None)
    subprocess.run(["pulseaudio", "-D", "-n", "--exit-idle-time=-1", "--disallow-exit", "--log-target=stderr",
                    "--load=module-native-protocol-unix", "--load=module-null-sink sink_name=parley_out",
                    "--load=module-null-sink sink_name=parley_mic"], env=full, check=True, timeout=30,
                   capture_output=True)
    pid = int((runtime / "pulse" / "pid").read_text())
    try:
        subprocess.run(["pactl", "set-default-sink", "parley_out"], env=full, check=True, timeout=10)
        subprocess.run(["pactl", "set-default-source", "parley_mic.monitor"], env=full, check=True, timeout=10)
        yield env
    finally:
        os.kill(pid, signal.SIGTERM)
        shutil.rmtree(runtime, ignore_errors=True)
