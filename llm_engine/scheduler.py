"""Scheduler policy for continuous batching: who gets admitted, whose prompt chunk runs, who decodes this step.

Pure bookkeeping over request ids (FIFO admission, bounded batch, one prefill chunk per step beside one
batched decode of every running request, prompt chunks shared round-robin by session); it knows nothing about
models, tensors, slots or threads.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class StepPlan:
    prefill: int | None  # the job whose next prompt chunk runs this step: its session's turn (round-robin), not held
    prefill_tokens: int  # at most this many prompt tokens in that chunk
    decode: tuple[int, ...]  # every job past its prefill and not held, decoded together in one batched forward


CHUNK_TOKENS = 128  # a prompt chunk while others decode: bounds how long their next token waits
MAX_CHUNK_TOKENS = 512  # nobody decoding, and any chunk: bounds the [T, kv_len] attention mask and activations
MIN_CHUNK_TOKENS = 8  # a paced chunk (ChunkPace) takes at least this many


@dataclass
class ChunkPace:
    """How many prompt tokens a chunk beside decoding requests may take so that it lasts about `budget_ms`: their
    next token waits for the chunk, so a fixed count (128, ~0.15 s of SmolLM2-135M) stalled every reply for ~1 s on a
    model eight times slower. From the chunks run so far (a moving average of their cost a token); never above
    `cap` or below MIN_CHUNK_TOKENS. Pure: the engine hands in each chunk's size and time."""

    budget_ms: float
    cap: int
    ms_per_token: float | None = None

    seen: int = 0  # chunks observed

    def observe(self, tokens: int, ms: float) -> None:
        if tokens < MIN_CHUNK_TOKENS or ms <= 0:
            return  # a short chunk's fixed cost (a step's dispatch, the head) would read as a slow model
        self.seen += 1
        if self.seen == 1:
            return  # the first pays first-call costs (allocations, lazy initialisation): not the model's pace
        rate = ms / tokens
        self.ms_per_token = rate if self.ms_per_token is None else 0.8 * self.ms_per_token + 0.2 * rate

    def tokens(self) -> int:
        if self.ms_per_token is None or self.budget_ms <= 0:
            return self.cap
        return max(min(MIN_CHUNK_TOKENS, self.cap), min(self.cap, int(self.budget_ms / self.ms_per_token)))


class BatchScheduler:
    """Jobs move queued -> prefilling -> decoding -> removed.

    Why nobody starves: admission is FIFO; the step's prompt chunk goes round-robin by session (the session whose
    chunk ran longest ago, ties to the earliest admitted), so with k sessions prefilling a prompt of P tokens reaches
    its first token within k * ceil(P / chunk_tokens) steps, however long the others' prompts or queues are (one
    session's backlog of long prompts is its own); and every decoding job advances by one token every step,
    because a prompt chunk is capped while others decode.
    """

    def __init__(self, *, max_batch: int, chunk_tokens: int = CHUNK_TOKENS, solo_chunk_tokens: int = MAX_CHUNK_TOKENS) -> None:
        if max_batch < 1 or chunk_tokens < 1 or solo_chunk_tokens < chunk_tokens:
            raise ValueError("need max_batch >= 1 and 1 <= chunk_tokens <= solo_chunk_tokens")
        self.max_batch = max_batch
        self.chunk_tokens = chunk_tokens  # while others decode: bounds how long their next token waits
        self.solo_chunk_tokens = solo_chunk_tokens  # nobody decoding: bigger chunks, fewer forwards
        self._queued: deque[int] = deque()
        self._prefilling: list[int] = []  # admission order
        self._decoding: list[int] = []  # order they finished prefill
        self._held: set[int] = set()  # keep their place and slot but sit steps out (their caller asked)
        self._session: dict[int, object] = {}  # job -> its session (the job itself when none was given)
        self._chunks_run = 0  # prompt chunks run so far (chunk_ran)
        self._last_chunk: dict[object, int] = {}  # session -> the number of its last chunk (round-robin)
        self._background: set[int] = set()  # jobs nobody waits for (enqueue)

    def enqueue(self, job_id: int, session: object = None, background: bool = False) -> None:
        """`session`: jobs of one session share its turn at prefill (None: the job is a session of its own).
        `background`: work nobody waits for (a summary written ahead): its prompt runs only while no other prompt
        does, and in small chunks even alone, so a request that arrives waits at most one small chunk for it."""
        self._queued.append(job_id)
        self._session[job_id] = job_id if session is None else session
        if background:
            self._background.add(job_id)

    def queued(self) -> list[int]:
        """In arrival order: admission is first come, first served."""
        return list(self._queued)

    def running(self) -> list[int]:
        return self._prefilling + self._decoding

    def runnable(self) -> bool:
        """Whether a step has work: a running job that is not held."""
        return any(j not in self._held for j in self._prefilling + self._decoding)

    def hold(self, job_id: int, on: bool) -> None:
        """A held job keeps its slot and place but runs no step until released (e.g. while its caller synthesises
        the first phrase: the cores go to what the user is waiting for)."""
        if on and job_id in (*self._queued, *self._prefilling, *self._decoding):
            self._held.add(job_id)
        else:
            self._held.discard(job_id)

    def decoding(self) -> list[int]:
        return list(self._decoding)

    def has_room(self) -> bool:
        return len(self._prefilling) + len(self._decoding) < self.max_batch

    def start(self, job_id: int) -> None:
        """Admitted (it holds a slot now): its prompt is next to run."""
        if not self.has_room():
            raise RuntimeError("batch is full")
        self._queued.remove(job_id)
        self._prefilling.append(job_id)

    def prefill_done(self, job_id: int) -> None:
        """Its first token is out: from the next step on it decodes with the batch."""
        self._prefilling.remove(job_id)
        self._decoding.append(job_id)

    def chunk_ran(self, job_id: int) -> None:
        """A prompt chunk of `job_id` ran: its session goes to the back of the round-robin."""
        self._chunks_run += 1
        self._last_chunk[self._session.get(job_id, job_id)] = self._chunks_run

    def remove(self, job_id: int) -> None:
        self._held.discard(job_id)
        self._background.discard(job_id)
        self._session.pop(job_id, None)
        # A session's turn outlives its job (its next prompt must not jump the others'); the oldest turns are
        # forgotten past a bound, which changes nothing: forgotten or not, they sort first.
        if len(self._last_chunk) > 4 * self.max_batch + 256:
            for session in sorted(self._last_chunk, key=self._last_chunk.__getitem__)[: len(self._last_chunk) // 2]:
                del self._last_chunk[session]
        for group in (self._queued, self._prefilling, self._decoding):
            if job_id in group:
                group.remove(job_id)
                return

    def plan(self) -> StepPlan:
        """What the next step runs (no state changes: call chunk_ran when the chunk ran)."""
        ready = [j for j in self._prefilling if j not in self._held]
        ready = [j for j in ready if j not in self._background] or ready  # background prompts after every other
        prefill = min(ready, key=lambda j: self._last_chunk.get(self._session.get(j, j), 0), default=None)
        decode = tuple(j for j in self._decoding if j not in self._held)
        tokens = self.chunk_tokens if decode or prefill in self._background else self.solo_chunk_tokens
        return StepPlan(prefill, tokens if prefill is not None else 0, decode)
