"""A lossy link's effect on the microphone the server hears over WebRTC: aiortc's audio jitter buffer waits for a
lost packet until 16 packets later (a 300 ms stall, and 300 ms more delay for the rest of the call), and a lost
packet's 20 ms vanish from the timeline. `SkippingJitterBuffer` gives a missing packet up once the buffer's prefetch
has arrived behind it; `Concealer` fills what is missing (RTP time) with the last pitch period, fading out.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket

log = logging.getLogger(__name__)

FADE_MS = 60.0  # a concealment fades from the last period's level to silence over this
CROSSFADE_MS = 2.5  # the concealment's continuation blends into the first frame after a hole
MAX_HOLE_MS = 1000.0  # a jump in RTP time longer than this is a new timeline (a new source), not a loss
PITCH_HZ = (70.0, 400.0)  # the periods searched for in the last audio
HISTORY_MS = 40.0


class SkippingJitterBuffer(JitterBuffer):
    """aiortc's JitterBuffer for audio (a packet, a frame), except that a missing packet does not hold the frames
    around it: a frame goes on once `prefetch` frames wait behind it, counted across gaps, and a gap that reaches
    the head is given up (lost). aiortc's stops at the first gap until the buffer overflows: 300 ms of nothing,
    then every frame 300 ms late for the rest of the call. In order and lossless the two hand on the same frames
    at the same packets; a late packet is still used if it comes before its frame's turn."""

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        frame, frames, remove = None, 0, 0
        packets: list[RtpPacket] = []
        timestamp = None
        for count in range(self.capacity):
            packet = self._packets[(self._origin + count) % self.capacity]
            if packet is None:
                continue  # missing: not waited for; it still counts if it comes before its frame's turn
            if timestamp is None:
                timestamp = packet.timestamp
            elif packet.timestamp != timestamp:
                if frame is None:  # the first complete frame is the one to hand on
                    frame = JitterFrame(data=b"".join(p._data for p in packets), timestamp=timestamp)  # type: ignore[attr-defined]
                    remove = count
                frames += 1
                if frames >= self._prefetch:
                    self.remove(remove)
                    return frame
                packets, timestamp = [], packet.timestamp
            packets.append(packet)
        return None


JITTER_BUFFER_ATTR = "_RTCRtpReceiver__jitter_buffer"  # aiortc keeps it private (pinned in constraints.txt)


def skip_lost_packets(pc: Any) -> int:
    """Give each audio receiver of `pc` (an RTCPeerConnection, its remote description set) a SkippingJitterBuffer
    with aiortc's own capacity and prefetch. -> how many were replaced (0 if aiortc's layout changed: logged)."""
    replaced = 0
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        old = getattr(receiver, JITTER_BUFFER_ATTR, None)
        if transceiver.kind != "audio" or isinstance(old, SkippingJitterBuffer):
            continue
        if type(old) is not JitterBuffer:
            log.warning("aiortc's receiver has no JitterBuffer at %s: lost packets stall it", JITTER_BUFFER_ATTR)
            continue
        setattr(receiver, JITTER_BUFFER_ATTR, SkippingJitterBuffer(old.capacity, old._prefetch))
        replaced += 1
    return replaced


def _period(history: np.ndarray, sample_rate: int) -> int:
    """The strongest repetition period (samples) of the recent audio within PITCH_HZ; the longest for noise."""
    lo, hi = int(sample_rate / PITCH_HZ[1]), int(sample_rate / PITCH_HZ[0])
    if len(history) < 2 * hi:
        return max(1, min(len(history), hi))
    x = history[-2 * hi :]
    best, best_score = hi, -1.0
    for lag in range(lo, hi + 1):
        a, b = x[lag:], x[:-lag]
        denom = float(np.sqrt(np.dot(a, a) * np.dot(b, b)))
        score = float(np.dot(a, b)) / denom if denom > 0 else 0.0
        if score > best_score:
            best, best_score = lag, score
    return best


class Concealer:
    """One stream's audio in RTP time: `push(pts, samples)` (pts in samples at `sample_rate`) returns the samples
    to hear, a hole before them filled with the last period repeated and fading, so the timeline never shifts.
    A frame that overlaps what was heard is trimmed; a jump beyond MAX_HOLE_MS starts a new timeline."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self.concealed_samples = 0  # in all
        self._next_pts: int | None = None
        self._history = np.zeros(0, dtype=np.float32)
        self._tail: np.ndarray | None = None  # the concealment's continuation, to blend into the next frame

    def push(self, pts: int, samples: np.ndarray) -> np.ndarray:
        x = np.asarray(samples, dtype=np.float32)
        max_hole = int(MAX_HOLE_MS * self.sample_rate / 1000)
        gap = 0 if self._next_pts is None else pts - self._next_pts
        if gap > max_hole or gap < -max_hole:  # a new timeline
            gap = 0
        elif gap < 0:  # already heard (a duplicate, or late): only what is new
            x = x[-gap:]
            pts, gap = pts - gap, 0
        if gap > 0:
            fill = self._conceal(gap)
            self.concealed_samples += gap
            out = np.concatenate([fill, self._blend(x)])
        else:
            out = x
        self._next_pts = pts + len(x)
        if out.size:
            keep = int(HISTORY_MS * self.sample_rate / 1000)
            self._history = np.concatenate([self._history, out])[-keep:]
        return out

    def _conceal(self, n: int) -> np.ndarray:
        if self._history.size == 0:
            return np.zeros(n, dtype=np.float32)
        period = self._history[-_period(self._history, self.sample_rate) :]
        blend = int(CROSSFADE_MS * self.sample_rate / 1000)
        tiled = np.resize(period, n + blend)  # the last period, again and again
        fade = np.clip(1.0 - np.arange(n + blend) / (FADE_MS * self.sample_rate / 1000), 0.0, 1.0)
        tiled = (tiled * fade).astype(np.float32)
        self._tail = tiled[n:]
        return tiled[:n]

    def _blend(self, x: np.ndarray) -> np.ndarray:
        tail, self._tail = self._tail, None
        if tail is None or x.size == 0:
            return x
        n = min(len(tail), len(x))
        w = np.linspace(0.0, 1.0, n, endpoint=False, dtype=np.float32)
        out = x.copy()
        out[:n] = tail[:n] * (1.0 - w) + x[:n] * w
        return out
