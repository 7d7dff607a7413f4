"""Playback jitter buffer: reply audio in, speaker blocks out, barge-in `clear()` drops it at once.

Pure and thread-safe (network thread pushes, audio thread pulls). Knows samples and turn ids only:
no devices, no sockets, no resampling. Times are whatever clock the caller passes (perf_counter seconds).
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Playback:
    """What the speaker has done with one turn so far."""

    turn_id: int
    started_at_s: float | None  # perf_counter time of the turn's first sample at the speaker
    played_ms: float
    finished: bool  # the turn ended and every sample of it has been played (or it was cleared)
    arrived_at_s: float | None = None  # when the turn's first audio message arrived (push's arrival_s)
    underruns: int = 0  # times this turn ran dry part-way and paused to rebuffer

    @property
    def start_ms(self) -> float | None:
        """The client's own playback start: first audio arrival to first sample at the speaker (output latency in)."""
        if self.started_at_s is None or self.arrived_at_s is None:
            return None
        return (self.started_at_s - self.arrived_at_s) * 1000.0


@dataclass
class _Turn:
    turn_id: int
    last_seq: int = -1
    ended: bool = False
    cleared: bool = False
    started_at_s: float | None = None
    arrived_at_s: float | None = None
    underruns: int = 0
    played: int = 0  # samples
    chunks: collections.deque[np.ndarray] = field(default_factory=collections.deque)
    buffered: int = 0  # samples waiting in chunks


class JitterBuffer:
    """Turns play in arrival order. A turn starts once the jitter target is queued (or it has ended),
    and after an underrun it waits for the target again, so network jitter costs one pause instead of
    many clicks. The target starts at `prebuffer_ms` (0: play the first message as it arrives) and is
    adaptive: each underrun raises it by `step_ms` (up to `max_prebuffer_ms`), each turn played through
    without one lowers it by `step_ms` again (docs/protocol.md, Client playback start)."""

    def __init__(self, sample_rate: int, prebuffer_ms: float = 0.0, *, step_ms: float = 20.0,
                 max_prebuffer_ms: float = 200.0) -> None:
        if prebuffer_ms < 0 or step_ms < 0 or max_prebuffer_ms < prebuffer_ms:
            raise ValueError(f"jitter target: need 0 <= prebuffer_ms ({prebuffer_ms}) <= max_prebuffer_ms "
                             f"({max_prebuffer_ms}) and step_ms >= 0 ({step_ms})")
        self.sample_rate = sample_rate
        self._floor = int(prebuffer_ms * sample_rate / 1000)
        self._step = int(step_ms * sample_rate / 1000)
        self._max = int(max_prebuffer_ms * sample_rate / 1000)
        self._prebuffer = self._floor
        self._turns: collections.OrderedDict[int, _Turn] = collections.OrderedDict()
        self._done: dict[int, _Turn] = {}  # finished or cleared, kept so late chunks are dropped
        self._lock = threading.Lock()
        self._buffering = True
        self.underruns = 0
        self.held = False  # playback paused in place (speech under a reply): pull() plays silence, keeps the audio

    @property
    def target_ms(self) -> float:
        """The jitter target now: audio queued before a turn starts (or resumes after an underrun)."""
        return self._prebuffer * 1000 / self.sample_rate

    def push(self, turn_id: int, seq: int, pcm: np.ndarray, arrival_s: float | None = None) -> bool:
        """Queue one chunk (float32 [n] at sample_rate) that arrived at `arrival_s`. False if dropped:
        a cleared or finished turn, or a repeated sequence number."""
        with self._lock:
            if turn_id in self._done:
                return False
            turn = self._turns.get(turn_id)
            if turn is None:
                turn = self._turns[turn_id] = _Turn(turn_id)
            if seq <= turn.last_seq or turn.ended:
                return False
            turn.last_seq = seq
            if turn.arrived_at_s is None:
                turn.arrived_at_s = arrival_s
            if len(pcm):
                turn.chunks.append(np.asarray(pcm, dtype=np.float32))
                turn.buffered += len(pcm)
            return True

    def end_turn(self, turn_id: int) -> None:
        """No more audio will come for this turn: play out its tail even if under the prebuffer."""
        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is not None:
                turn.ended = True
            elif turn_id not in self._done:
                self._done[turn_id] = _Turn(turn_id, ended=True)

    def clear(self, turn_id: int | None = None) -> int:
        """Drop the buffered audio of one turn (or of all); later chunks of it are dropped too.
        Returns how many samples were dropped."""
        with self._lock:
            ids = list(self._turns) if turn_id is None else [turn_id]
            dropped = 0
            for tid in ids:
                turn = self._turns.pop(tid, None) or _Turn(tid)
                dropped += turn.buffered
                turn.chunks.clear()
                turn.buffered = 0
                turn.cleared = turn.ended = True
                self._done[tid] = turn
            self._buffering = True
            self.held = False
            return dropped

    def pull(self, n: int, now_s: float = 0.0) -> np.ndarray:
        """The next `n` samples for the speaker (zeros where nothing is ready). `now_s` is when the
        first returned sample reaches the speaker."""
        out = np.zeros(n, np.float32)
        pos = 0
        with self._lock:
            while pos < n and self._turns and not self.held:
                turn = next(iter(self._turns.values()))
                if self._buffering and turn.buffered < self._prebuffer and not turn.ended:
                    break
                was_buffering, self._buffering = self._buffering, False
                if turn.buffered == 0:
                    if turn.ended:
                        self._turns.popitem(last=False)
                        self._done[turn.turn_id] = turn
                        if turn.underruns == 0 and turn.played:  # played through smoothly: the target may come down
                            self._prebuffer = max(self._floor, self._prebuffer - self._step)
                        continue
                    if turn.played and not was_buffering:  # ran dry part-way (not waiting for first audio, not again)
                        self.underruns += 1
                        turn.underruns += 1
                        self._prebuffer = min(self._max, self._prebuffer + self._step)
                    self._buffering = True
                    break
                head = turn.chunks[0]
                take = min(n - pos, len(head))
                if turn.started_at_s is None:
                    turn.started_at_s = now_s + pos / self.sample_rate
                out[pos:pos + take] = head[:take]
                pos += take
                turn.played += take
                turn.buffered -= take
                if take == len(head):
                    turn.chunks.popleft()
                else:
                    turn.chunks[0] = head[take:]
        return out

    def playing(self) -> bool:
        """True while some turn has audio queued or is part-way through."""
        with self._lock:
            return any(t.buffered or (t.started_at_s is not None and not t.ended) for t in self._turns.values())

    def buffered_ms(self) -> float:
        with self._lock:
            return sum(t.buffered for t in self._turns.values()) * 1000 / self.sample_rate

    def status(self, turn_id: int) -> Playback | None:
        with self._lock:
            turn = self._turns.get(turn_id) or self._done.get(turn_id)
            if turn is None:
                return None
            finished = turn_id in self._done
            return Playback(turn_id, turn.started_at_s, turn.played * 1000 / self.sample_rate, finished,
                            turn.arrived_at_s, turn.underruns)
