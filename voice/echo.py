"""The assistant's own voice, taken out of the user's microphone on the server: WebRTC's AEC3 (pywebrtc-audio) with
the reply audio the server sent as its far end, laid on the microphone's timeline by the client's playback marks.

No client has to bring an echo canceller for Parley to ignore its own voice. Knows nothing of sockets or turns'
meaning: the session tells it what was sent, what plays (marks, holds, clears), and hands it the microphone audio.
Measured in docs/turn-taking.md, "Interruptions".
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from voice.audio import SAMPLE_RATE
from voice.echo_presence import EchoPresence

BLOCK = SAMPLE_RATE // 100  # AEC3 works on 10 ms blocks
TAIL_MS = 1500.0  # after the last far-end sample the room may still echo; past it the microphone passes untouched
LEAD_MS = 80.0  # the far end is laid this much early: AEC3 finds an echo that comes later (mark jitter included), never one that came before
# The marks' median moving less than this is jitter AEC3's own delay search absorbs (a jump costs it ~2 s). Later
# (the far end would lead the echo by more): only past REANCHOR_MS; earlier (it would come after the echo, which no
# canceller can take out): past EARLIER_MS.
REANCHOR_MS = 100.0
EARLIER_MS = 40.0
MARKS_KEPT = 8  # the last marks of the playing reply whose median places it
KEEP_TURNS = 2  # replies whose audio is kept (the one playing, the one before whose tail may still echo)
MAX_TURN_S = 120.0  # a reply's audio kept at most this long (bounds memory)


class Aec(Protocol):
    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray: ...


def webrtc_aec() -> Aec:
    from pywebrtc_audio import EchoCanceller  # lazy: a compiled extension

    return EchoCanceller(sample_rate=SAMPLE_RATE, num_channels=1, stream_delay_ms=0)


def aec_available() -> bool:
    try:
        import pywebrtc_audio  # noqa: F401
    except ImportError:
        return False
    return True


class ServerEcho:
    """What was sent -> what plays when (in microphone audio time) -> AEC3's far end, block by block. The first
    stage of the session's audio front end (voice.frontend): it must hear the microphone as it came."""

    name = "echo"
    heavy = False  # AEC3 on a 10 ms block costs microseconds
    delay_ms = 1000.0 * BLOCK / SAMPLE_RATE  # up to one block held for the next call

    def __init__(self, make_aec: Callable[[], Aec] = webrtc_aec) -> None:
        # Only a client's playback marks place the far end: a guess from when audio was sent is wrong for a client that
        # buffers or does not play at all, and AEC3 then suppresses the user's first second against an echo that
        # never comes.
        self._make_aec = make_aec
        self._aec: Aec | None = None  # built at the first reply audio
        self._audio: OrderedDict[int, list[np.ndarray]] = OrderedDict()  # turn -> float32 pieces at 16 kHz
        self._joined: dict[int, np.ndarray] = {}
        self._anchor: tuple[int, float] | None = None  # (turn, offset): its position p ms plays at mic time p + offset
        self._offsets: deque[float] = deque(maxlen=MARKS_KEPT)
        self._pending = np.zeros(0, np.float32)
        self._last_far_ms = -1e12
        self.presence = EchoPresence()  # the canceller's output is used only while the echo is really there
        self.blocks_cancelled = 0

    # -- what plays ---------------------------------------------------------------------------------------

    def sent(self, turn_id: int, audio_16k: np.ndarray) -> None:
        """Reply audio as it is queued for the client, in order (float32 at 16 kHz)."""
        pieces = self._audio.setdefault(turn_id, [])
        if sum(len(p) for p in pieces) < MAX_TURN_S * SAMPLE_RATE:
            pieces.append(np.asarray(audio_16k, np.float32))
            self._joined.pop(turn_id, None)
        while len(self._audio) > KEEP_TURNS:
            old, _ = self._audio.popitem(last=False)
            self._joined.pop(old, None)

    def played(self, turn_id: int, played_ms: float, mic_ms: float) -> None:
        """A playback mark: `played_ms` of the turn had played when the microphone's audio reached `mic_ms`."""
        offset = mic_ms - played_ms
        if self._anchor is None or self._anchor[0] != turn_id:
            self._anchor, self._offsets = (turn_id, offset), deque([offset], maxlen=MARKS_KEPT)
            return
        self._offsets.append(offset)
        median = float(np.median(self._offsets))
        if self._moves(median):
            self._anchor = (turn_id, median)

    def _moves(self, offset: float) -> bool:
        assert self._anchor is not None
        shift = offset - self._anchor[1]
        return shift >= REANCHOR_MS or -shift >= EARLIER_MS

    def paused(self, turn_id: int, played_ms: float) -> None:
        """A mark that says playback is paused there (speech over the reply): nothing plays until the next mark.
        (A client that cannot pause, a phone line, never sends one: its reply goes on playing.)"""
        self._anchor = None
        self.presence.gap()

    def stop(self) -> None:
        """Playback was cleared: nothing plays until the next mark."""
        self._anchor = None
        self.presence.gap()

    # -- the microphone -----------------------------------------------------------------------------------

    def process(self, samples: np.ndarray, t_ms: float) -> np.ndarray:
        """Microphone audio (float32 at 16 kHz) starting at audio time `t_ms` -> the same audio with the reply's echo
        taken out, in whole 10 ms blocks (up to one block is kept for the next call). The canceller runs (and learns)
        whenever something plays, but its output replaces the microphone's only while the echo is there
        (voice.echo_presence): on a microphone that does not hear the loudspeaker it would only take the user's words."""
        buf = np.concatenate([self._pending, np.asarray(samples, np.float32)])
        start_ms = t_ms - 1000.0 * len(self._pending) / SAMPLE_RATE
        whole = len(buf) // BLOCK * BLOCK
        out = buf[:whole].copy()
        for i in range(0, whole, BLOCK):
            block_ms = start_ms + 1000.0 * i / SAMPLE_RATE
            far = self._far(block_ms)
            if far is None and block_ms - self._last_far_ms > TAIL_MS:
                continue  # nothing played lately: the user's audio passes as it came
            if self._aec is None:
                self._aec = self._make_aec()
            near = buf[i : i + BLOCK]
            cancelled = self._aec.process(near, far if far is not None else np.zeros(BLOCK, np.float32))
            if far is not None:
                self.presence.push(near, far, block_ms)
            if self.presence.present(block_ms):
                out[i : i + BLOCK] = cancelled
                self.blocks_cancelled += 1
        self._pending = buf[whole:]
        return out

    def _far(self, mic_ms: float) -> np.ndarray | None:
        """The reply audio playing at microphone time `mic_ms` (one block), or None when nothing plays."""
        if self._anchor is None:
            return None
        turn, offset = self._anchor
        audio = self._joined.get(turn)
        if audio is None:
            pieces = self._audio.get(turn)
            if not pieces:
                return None
            audio = self._joined[turn] = np.concatenate(pieces)
        at = int((mic_ms - offset + LEAD_MS) * SAMPLE_RATE / 1000.0)
        if at + BLOCK <= 0 or at >= len(audio):
            return None
        far = np.zeros(BLOCK, np.float32)
        lo, hi = max(at, 0), min(at + BLOCK, len(audio))
        far[lo - at : hi - at] = audio[lo:hi]
        self._last_far_ms = mic_ms
        return far
