"""Whether the microphone hears the replies at all: the normalised cross-correlation of what the microphone took in with
what played, over the delays an echo can have. Pure numpy, no clock of its own (audio time comes with the blocks).

WebRTC's AEC3 assumes an echo path until it has found one, so on a microphone that never hears the loudspeaker
(a headset, a client that cancels its own echo without saying so) it suppresses the user's first words under a reply:
a spoken "yeah" came out 45 dB down, "Wait, stop." lost its words. voice.echo applies the canceller's output unless
this measured, lately, that no echo is there: before the first measurement (the first half second a reply plays) and
for a while after an echo was found, the canceller's output is used.
"""
from __future__ import annotations

import numpy as np

WINDOW = 8000  # samples (0.5 s at 16 kHz) of microphone audio per measurement
MAX_LAG = 8000  # the echo may come up to 0.5 s after the far end as it was laid (placement lead + room + jitter)
# A peak this high, twice running at the same delay (within LAG_TOLERANCE), is the far end's echo. Measured on the
# tests' corpus voices: other speech over a reply peaks at 0.12 (median), 0.5 (p99), never twice at one delay; an echo
# at -10..-30 dB peaks at 0.8-1.0, in a simulated 300 ms room 0.3-0.6, its delay within 15 ms from window to window
# (the direct path and an early reflection take turns as the strongest: lags of 1459 to 1690 samples in one run).
MIN_CORRELATION = 0.3
LAG_TOLERANCE = 240  # samples (15 ms): a room's strongest path moves this much between windows (at 10 ms, 2 of 16
# renderings of the tests' room echo were never found)
HOLD_MS = 60_000.0  # a measurement holds this long (a room, a speakerphone or a headset does not change by the phrase)
MIN_FAR_RMS = 10 ** (-50 / 20)  # a far end this quiet measures nothing
SILENT_MIC_RMS = 10 ** (-65 / 20)  # the far end plays and the microphone stays this quiet: it does not hear it


def _fft_size(n: int) -> int:
    return 1 << (n - 1).bit_length()


def peak_correlation(mic: np.ndarray, far: np.ndarray) -> tuple[float, int]:
    """(the highest normalised correlation, its index i) over far[i : i + len(mic)] against `mic`: `far` holds the
    MAX_LAG samples before the microphone's window and the window itself, so index i is a delay of
    len(far) - len(mic) - i samples."""
    n, m = len(mic), len(far)
    size = _fft_size(n + m)
    cross = np.fft.irfft(np.fft.rfft(far, size) * np.conj(np.fft.rfft(mic, size)), size)[: m - n + 1]
    energy = np.concatenate([[0.0], np.cumsum(far.astype(np.float64) ** 2)])
    far_norm = np.sqrt(np.maximum(energy[n:] - energy[: m - n + 1], 1e-20))
    mic_norm = float(np.sqrt(np.sum(mic.astype(np.float64) ** 2)))
    corr = np.abs(cross) / (far_norm * mic_norm + 1e-20)
    corr[far_norm < MIN_FAR_RMS * np.sqrt(n)] = 0.0  # a silent stretch of the far end echoes nothing (its FFT noise /
    # its near-zero norm read as correlations of 100 and more, at a delay where nothing played)
    i = int(np.argmax(corr))
    return float(corr[i]), i


class EchoPresence:
    """Fed the microphone and the far end block by block (while something plays); says whether the echo is there."""

    def __init__(self) -> None:
        self._mic: list[np.ndarray] = []
        self._far: list[np.ndarray] = []
        self._far_before = np.zeros(MAX_LAG, np.float32)  # the far end before the window (the echo's source)
        self._samples = 0
        self._present_ms: float | None = None  # audio time of the last window that held the echo
        self._absent_ms: float | None = None  # ... and of the last one that did not
        self._last_peak: tuple[float, int] | None = None  # the window before's (correlation, index)
        self.correlation: float | None = None  # the last measurement, for the trace and the tests

    def push(self, mic: np.ndarray, far: np.ndarray, t_ms: float) -> None:
        """One block of microphone audio and the far end laid at the same audio time `t_ms` (its start)."""
        self._mic.append(mic)
        self._far.append(far)
        self._samples += len(mic)
        if self._samples < WINDOW:
            return
        mic_w, far_w = np.concatenate(self._mic), np.concatenate(self._far)
        self._mic, self._far, self._samples = [], [], 0
        far_all = np.concatenate([self._far_before, far_w])
        self._far_before = far_all[-MAX_LAG:]
        if _rms(far_w) < MIN_FAR_RMS:
            return
        end_ms = t_ms + 1000.0 * len(mic) / 16000.0
        peak = (0.0, -1) if _rms(mic_w) < SILENT_MIC_RMS else peak_correlation(mic_w, far_all)
        before, self._last_peak = self._last_peak, peak
        self.correlation = peak[0]
        if peak[0] < MIN_CORRELATION:
            self._absent_ms = end_ms
        elif before is not None and before[0] >= MIN_CORRELATION and abs(before[1] - peak[1]) <= LAG_TOLERANCE:
            self._present_ms = end_ms  # (one high peak alone says nothing either way)

    def gap(self) -> None:
        """Nothing plays: the far end's history is silence from here."""
        self._mic, self._far, self._samples = [], [], 0
        self._far_before = np.zeros(MAX_LAG, np.float32)
        self._last_peak = None

    def present(self, t_ms: float) -> bool:
        """Cancel at `t_ms`? Yes unless a recent measurement found no echo and none lately found one."""
        if self._present_ms is not None and t_ms - self._present_ms < HOLD_MS:
            return True
        return self._absent_ms is None or t_ms - self._absent_ms >= HOLD_MS


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) if len(x) else 0.0
