"""Engine: the one dedicated thread that owns the model, the KV cache and every request's progress.

submit() returns an EngineStream of events. Continuous batching: each step runs one prompt chunk of the
earliest admitted request and one batched decode forward over every other running request, as planned by
BatchScheduler (pure policy). It knows nothing about asyncio, sockets or audio: callers bridge events themselves.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from llm_engine.batch import DecodeRow, StepDecoder
from llm_engine.families import UNKNOWN, Family
from llm_engine.generation import Generation
from llm_engine.kv_cache import MIN_SHARED_PREFIX, SlotTable, StaticKVCache, common_prefix_len
from llm_engine.model import Transformer
from llm_engine.prefix_pins import PrefixPins
from llm_engine.request import (
    ChatMessage,
    ErrorEvent,
    Event,
    FinishEvent,
    GenerateRequest,
    SamplingParams,
    Timings,
    TokenEvent,
)
from llm_engine.scheduler import CHUNK_TOKENS, BatchScheduler, ChunkPace, StepPlan
from llm_engine.stream import WAKE, EngineStream, Hold, Release
from llm_engine.tokenizer import Tokenizer

if TYPE_CHECKING:  # imported lazily at run time: most engines do not speculate
    from llm_engine.native.decoder import NativeDecoder
    from llm_engine.solo_speculation import SoloSpeculation

__all__ = [
    "ChatMessage", "SamplingParams", "GenerateRequest", "Timings", "TokenEvent", "FinishEvent", "ErrorEvent",
    "Event", "EngineStream", "Engine",
]  # fmt: skip

EventCallback = Callable[[Event], None]


@dataclass
class _Job:
    id: int
    req: GenerateRequest
    stream: EngineStream
    on_event: EventCallback | None
    gen: Generation
    slot: int | None = None


class Engine:
    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        *,
        max_slots: int = 8,
        max_seq_len: int | None = None,
        prefill_chunk: int = CHUNK_TOKENS,
        draft: Transformer | None = None,
        draft_k: int = 4,
        cuda_graphs: bool = False,
        native: str = "auto",
        kv_dtype: torch.dtype | None = None,
        prefix_cache: bool = True,
        family: Family = UNKNOWN,
        chunk_budget_ms: float = 0.0,
    ) -> None:
        """draft: a model with the same tokenizer (e.g. speculative.make_self_draft(model)) that speculates
        for a request while it runs alone. cuda_graphs: replay captured batched decode steps (CUDA only).
        native: decode steps through the compiled CPU step (llm_engine/native): "auto" where it can run
        this model (CPU, float32, fused projections, a C++ compiler), "on" (fail if it cannot), "off".
        `decode_path` says which path decode steps take, and why. kv_dtype: the KV cache's element type
        (None: the model's; float16 under a float32 model halves what long conversations read). prefix_cache:
        a new request copies the longest prompt prefix another idle slot holds instead of computing it.
        chunk_budget_ms: while others decode, a prompt chunk takes as many tokens as fit this long at this model's
        measured cost a token (scheduler.ChunkPace; 0: always prefill_chunk, as the tests' schedules assume)."""
        self.model = model
        self.tokenizer = tokenizer
        self.family = family  # what the rest of Parley must know of this model (llm_engine.families)
        self.device = next(model.parameters()).device
        cfg = model.cfg
        self.max_seq_len = max_seq_len or model.max_seq_len
        dtype = kv_dtype or next(model.parameters()).dtype
        self.cache = StaticKVCache(
            cfg.num_layers, max_slots, cfg.num_kv_heads, self.max_seq_len, cfg.head_dim, dtype=dtype, device=self.device
        )
        self.slots = SlotTable(max_slots)
        # Batch bound = slots: every running request holds one. While others decode, a prompt runs in chunks
        # of prefill_chunk tokens at most, one per step, and of fewer where this model's chunks take longer than
        # chunk_budget_ms (ChunkPace): that caps how long their next token waits behind a long prompt.
        self.scheduler = BatchScheduler(max_batch=max_slots, chunk_tokens=prefill_chunk)
        self.pace = ChunkPace(chunk_budget_ms, prefill_chunk)
        self.steps = 0  # engine steps that did work (a prompt chunk and/or one batched decode)
        self.prefix_cache = prefix_cache
        self.prefix_hits = 0  # requests that copied a prompt prefix from another slot (written by the engine thread)
        self.prefix_tokens = 0  # the tokens those copies saved computing
        self.cancelled_prefills = 0  # requests cancelled before their prompt was through (queued, or part-way)
        self.pins = PrefixPins()  # system prompts' keys and values, outside the slots (a persona's prefix)
        self.busy_s: dict[str, float] = {}  # session -> its share of step seconds (admission's cost model)
        self.busy_total_s = 0.0  # seconds of steps in all
        self.speculation: SoloSpeculation | None = None
        if draft is not None:
            from llm_engine.solo_speculation import SoloSpeculation
            from llm_engine.speculative import SpeculativeDecoder, draft_cache_like

            decoder = SpeculativeDecoder(model, draft, self.cache, draft_cache_like(draft, self.cache), k=draft_k)
            self.speculation = SoloSpeculation(decoder)
        self.stepper = StepDecoder(model, self.cache, max_slots=max_slots, cuda_graphs=cuda_graphs, native=native)
        self.decode_path = self.stepper.path
        if self.speculation is not None:
            self.decode_path += "; a request running alone speculates (torch)"
        self._jobs: dict[int, _Job] = {}
        self._inbox: queue.Queue[object] = queue.Queue()
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Guards the slot table: release() and active_slots() run on callers' threads.
        self._lock = threading.Lock()
        self._releasing: set[str] = set()
        self.load_s = 0.0
        self._step_threads: Callable[[], int] | None = None
        self._team = 0  # the thread count the engine thread last set (0: never set: torch's default)

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_seq_len: int = 2048,
        max_slots: int = 8,
        quant: str = "none",
        group_size: int = 32,
        self_draft: str = "none",
        cuda_graphs: bool = False,
        native: str = "auto",
        kv_cache: str = "auto",
        prefix_cache: bool = True,
        chunk_budget_ms: float = 0.0,
    ) -> "Engine":
        """A Hugging Face folder or a .gguf file (converted once into the user cache dir).

        quant "int8" / "int4" swaps every projection for a weight-only quantized layer. From a GGUF, Q4_1
        (int4, group 32) and Q8_0 (int8) blocks are taken as stored rather than re-rounded from floats.
        self_draft "int8" / "int4": a quantized copy of the model drafts for requests running alone.
        kv_cache: the cache's element type, llm_engine.prepare.KV_DTYPES ("auto": float16 for a float32
        model on CPU, else the model's dtype).
        """
        from llm_engine.prepare import prepare

        t0 = time.perf_counter()
        p = prepare(path, device=device, dtype=dtype, max_seq_len=max_seq_len, quant=quant, group_size=group_size,
                    self_draft=self_draft, kv_cache=kv_cache)  # fmt: skip
        engine = cls(
            p.model, p.tokenizer, max_slots=max_slots, max_seq_len=max_seq_len, draft=p.draft,
            cuda_graphs=cuda_graphs, native=native, kv_dtype=p.kv_dtype, prefix_cache=prefix_cache, family=p.family,
            chunk_budget_ms=chunk_budget_ms,
        )  # fmt: skip
        engine.load_s = time.perf_counter() - t0
        return engine

    # -- caller side (any thread) ------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._inbox.put("stop")
        self._thread.join()
        self._thread = None

    def share_cores(self, threads: Callable[[], int] | None) -> None:
        """threads() -> how many threads the next step may use, asked before each step on the engine thread (CPU
        only): e.g. fewer while other stages' jobs run on the same cores, whose threads would otherwise take turns
        with the team's at every barrier of the step. None: torch's count throughout."""
        self._step_threads = threads

    def step_threads(self) -> int | None:
        """The thread count the next step would take now (None: cores are not shared; torch's count)."""
        return None if self._step_threads is None else max(1, int(self._step_threads()))

    def submit(self, req: GenerateRequest, on_event: EventCallback | None = None) -> EngineStream:
        job_id = next(self._ids)
        stream = EngineStream(job_id, self._inbox.put)
        gen = Generation(req, self.tokenizer, time.perf_counter(), self.device, self.max_seq_len)
        self._inbox.put(_Job(job_id, req, stream, on_event, gen))
        return stream

    @property
    def native(self) -> "NativeDecoder | None":
        """The compiled CPU decode step, when decode steps take it."""
        return self.stepper.native

    def release(self, session_id: str) -> None:
        """The session ended: cancel its requests and free its slot. Never blocks (it is called from event loops).

        An idle slot is freed at once; a busy one as soon as its request has been cancelled (within one step).
        """
        with self._lock:
            if not self.slots.release(session_id) and self.slots.slot_of(session_id) is not None:
                self._releasing.add(session_id)
        self._inbox.put(Release(session_id))

    def active_slots(self) -> int:
        """Slots owned by a session (running or keeping its cache between turns), not counting released ones."""
        with self._lock:
            return self.slots.owned() - sum(1 for s in self._releasing if self.slots.slot_of(s) is not None)

    def requests_besides(self, session_id: str) -> int:
        """Requests of other sessions the engine holds now (queued, running or held); a session's side slots
        (`<session>/<purpose>`, e.g. its summary's) are its own."""
        jobs = list(self._jobs.values())  # (a copy in one call: the engine thread adds and removes meanwhile)
        return sum(1 for j in jobs if j.req.session_id.split("/", 1)[0] != session_id)

    def step(self) -> StepPlan | None:
        """Run one engine step on the caller's thread, for an engine that was never started (tests count steps).

        -> what ran, or None when there was nothing to do.
        """
        if self._thread is not None:
            raise RuntimeError("the engine thread is running: it owns the steps")
        with torch.inference_mode():
            return self._iterate(block=False)

    # -- engine thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while not self._stopping:
                # Block only when nothing can run; otherwise just pick up what arrived.
                self._iterate(block=not self.scheduler.runnable())
            for job in list(self._jobs.values()):
                self._cancel(job)

    def _iterate(self, block: bool) -> StepPlan | None:
        try:
            self._handle(self._inbox.get(block=block))
            while True:
                self._handle(self._inbox.get_nowait())
        except queue.Empty:
            pass
        if self._stopping:
            return None
        self._reap_cancelled()
        self._admit()
        plan = self.scheduler.plan()
        if plan.prefill is None and not plan.decode:
            return None
        self.steps += 1
        self._size_team()
        if plan.prefill is not None:
            job = self._jobs[plan.prefill]
            t0 = time.perf_counter()
            self._prefill(job, plan.prefill_tokens)
            wall_s = time.perf_counter() - t0
            self._charge([job], wall_s)
            self.pace.observe(job.gen.last_chunk, 1000 * wall_s)
            self.scheduler.chunk_tokens = self.pace.tokens()
        # A callback of this step may have cancelled or ended someone: they sit this forward out.
        batch = [self._jobs[j] for j in plan.decode if j in self._jobs and not self._jobs[j].stream.cancelled.is_set()]
        if batch:
            t0 = time.perf_counter()
            self._decode(batch)
            self._charge(batch, time.perf_counter() - t0)
        # A request that waited for its session's earlier one (now retired) is admitted here, before the loop
        # decides whether to block: otherwise it would wait for the next message to arrive.
        self._admit()
        return plan

    def _handle(self, msg: object) -> None:
        if isinstance(msg, _Job):
            self._jobs[msg.id] = msg
            self.scheduler.enqueue(msg.id, msg.req.session_id, msg.req.background)
        elif isinstance(msg, Release):
            for job in [j for j in self._jobs.values() if j.req.session_id == msg.session_id]:
                self._cancel(job)
            with self._lock:
                self.slots.release(msg.session_id)
                self._releasing.discard(msg.session_id)
            self.busy_s.pop(msg.session_id, None)
        elif isinstance(msg, Hold):
            if msg.job_id in self._jobs:
                self.scheduler.hold(msg.job_id, msg.on)
        elif msg == "stop":
            self._stopping = True

    def _reap_cancelled(self) -> None:
        for job in [j for j in self._jobs.values() if j.stream.cancelled.is_set()]:
            self._cancel(job)

    def _admit(self) -> None:
        busy_sessions = {self._jobs[j].req.session_id for j in self.scheduler.running()}
        for job_id in self.scheduler.queued():
            if not self.scheduler.has_room():
                return
            job = self._jobs[job_id]
            if job.req.session_id in busy_sessions:
                continue  # one request per session at a time: they share the slot's cache
            with self._lock:
                slot = self.slots.acquire(job.req.session_id, job.gen.prompt, shared=job.req.share_prefix)
            if slot is None:
                return  # every slot is busy: FIFO, so later arrivals wait too
            job.slot = slot
            self._borrow_prefix(slot, job.gen.prompt)
            busy_sessions.add(job.req.session_id)
            self.scheduler.start(job_id)

    def _borrow_prefix(self, slot: int, prompt: list[int]) -> None:
        """A new request whose prompt starts with tokens another idle slot already holds copies those keys and
        values instead of computing them again (counted in prefix_hits / prefix_tokens and the request's Timings)."""
        if not self.prefix_cache:
            return
        with self._lock:
            donor = self.slots.prefix_donor(slot, prompt)
        own = common_prefix_len(self.slots.slots[slot].tokens, prompt)
        pinned = self.pins.best(prompt, at_least=max(own + MIN_SHARED_PREFIX, donor[1] + 1 if donor else 0))
        if pinned is not None:  # longer than what any idle slot holds (none may: all busy, or given to others)
            n = pinned[1]
            self.pins.copy_into(self.cache, pinned[0], slot, n)
        elif donor is not None:
            src, n = donor
            self.cache.copy_prefix(src, slot, n)
        else:
            return
        state = self.slots.slots[slot]
        state.tokens, state.borrowed = list(prompt[:n]), n
        self.prefix_hits += 1
        self.prefix_tokens += n

    def _charge(self, jobs: list[_Job], wall_s: float) -> None:
        """A forward's wall time, shared by the sessions in it: each one's share of the engine (the one serial
        resource every session shares; its thread team only spreads a step). Anonymous requests are not kept."""
        self.busy_total_s += wall_s
        for job in jobs:
            if not job.req.share_prefix:
                session = job.req.session_id
                self.busy_s[session] = self.busy_s.get(session, 0.0) + wall_s / len(jobs)

    def _size_team(self) -> None:
        if self.device.type != "cpu":
            return
        n = self.step_threads()
        if n is not None and n != self._team:  # the calling thread's own count; the compiled step reads it per call
            torch.set_num_threads(n)
            self._team = n

    def _prefill(self, job: _Job, max_tokens: int) -> None:
        assert job.slot is not None
        state = self.slots.slots[job.slot]
        self.scheduler.chunk_ran(job.id)  # its session goes to the back of the prefill round-robin
        try:
            if self.speculation is not None:
                self.speculation.pause(job.slot)
            events = job.gen.prefill(self.model, self.cache, job.slot, state, max_tokens, self.stepper)
        except Exception as exc:  # noqa: BLE001 - reported to the caller; the engine thread must live on
            events = self._fail(job, exc)
        if job.gen.prefilled and self.prefix_cache and _system_only(job.req):
            self._pin(job.slot, job.gen.prompt)
        if job.gen.prefilled and not job.gen.finished:
            self.scheduler.prefill_done(job.id)
        self._emit(job, events)

    def _pin(self, slot: int, prompt: list[int]) -> None:
        """A system prompt alone (a persona's warm-up) is every conversation's opening: keep it outside the slots."""
        n = common_prefix_len(self.slots.slots[slot].tokens, prompt)
        if n == len(prompt):
            self.pins.pin(self.cache, slot, prompt)

    def _decode(self, batch: list[_Job]) -> None:
        """One forward for every row of the batch, then each request samples from its own row."""
        if self.speculation is not None:
            if len(batch) == 1 and batch[0].gen.guide is None:  # drafts are not masked: constrained rows never speculate
                self._speculate(batch[0])
                return
            for job in batch:
                assert job.slot is not None
                self.speculation.pause(job.slot)
        rows = []
        for job in batch:
            assert job.slot is not None
            token, pos = job.gen.decode_input(self.slots.slots[job.slot])
            rows.append(DecodeRow(job.slot, token, pos))
        t0 = time.perf_counter()
        try:
            logits = self.stepper.decode(rows)  # [B, V]
        except Exception as exc:  # noqa: BLE001 - every row of the failed forward learns why
            for job in batch:
                self._emit(job, self._fail(job, exc))
            return
        step_ms = 1000 * (time.perf_counter() - t0)
        for i, job in enumerate(batch):
            assert job.slot is not None
            try:
                events = job.gen.take_logits(logits[i], self.cache, self.slots.slots[job.slot], step_ms)
            except Exception as exc:  # noqa: BLE001 - one request's sampling error must not end the others
                events = self._fail(job, exc)
            self._emit(job, events)

    def _speculate(self, job: _Job) -> None:
        assert job.slot is not None and self.speculation is not None
        try:
            events = self.speculation.step(job.gen, job.slot, self.slots.slots[job.slot], self.cache)
        except Exception as exc:  # noqa: BLE001 - reported to the caller; the engine thread must live on
            events = self._fail(job, exc)
        self._emit(job, events)

    def _cancel(self, job: _Job) -> None:
        if not job.gen.finished and not job.gen.prefilled:
            self.cancelled_prefills += 1
        self._emit(job, job.gen.cancel())

    def _fail(self, job: _Job, exc: Exception) -> list[Event]:
        assert job.slot is not None
        self.slots.slots[job.slot].tokens = []  # the cache rows may be half-written: trust none of them
        job.gen.finished = True
        return [ErrorEvent(f"{type(exc).__name__}: {exc}")]

    def _emit(self, job: _Job, events: list[Event]) -> None:
        if job.id not in self._jobs:
            return  # already retired, e.g. released from inside its own on_event callback
        for ev in events:
            job.stream._events.put(ev)
            if job.on_event is not None:
                try:
                    job.on_event(ev)
                except Exception as exc:  # noqa: BLE001 - a caller's callback must not kill the engine thread
                    err = ErrorEvent(f"on_event raised {type(exc).__name__}: {exc}")
                    job.stream._events.put(err)
                    job.gen.finished = True
                    break
        if job.gen.finished:
            self._retire(job)

    def _retire(self, job: _Job) -> None:
        self._jobs.pop(job.id, None)
        self.scheduler.remove(job.id)
        if job.slot is not None:
            with self._lock:
                self.slots.finish(job.slot)
            job.slot = None


def _system_only(req: GenerateRequest) -> bool:
    return len(req.messages) == 1 and req.messages[0].role == "system"
