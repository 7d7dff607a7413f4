"""What one server holds while it runs: its config, metrics, loaded stages, its conversations and the live sessions
that carry them, and whether it takes another session. Shared by the routes (web.app) and the socket handlers (web.ws, web.realtime)."""
from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parley import runtime as rt
from parley.conversation_db import SqlStore, digest
from parley.config import AppConfig
from parley.thread_budget import available_cores
from voice.conversation import Conversations, TurnSummary
from voice.outbox import Outbox
from voice.session import Session
from voice.stages import PersonaSpec, SessionSettings, Stages
from voice.trace import TurnTrace
from web.admission import Admission
from web.capacity import CostModel, LoadMeter, Refusal
from web.metrics import Metrics
from web.otel.export import Telemetry
from web.resume import ResumeTokens, UnknownToken


class ConversationInUse(Exception):
    """A connection carries the conversation now: it cannot be forgotten under it."""


@dataclass
class AppState:
    cfg: AppConfig
    metrics: Metrics
    settings: SessionSettings
    personas: dict[str, PersonaSpec]
    runtime: rt.Runtime | None = None
    sessions: dict[str, Session] = field(default_factory=dict)
    connections: int = 0  # accepted sockets, started or not
    pending: dict[Any, None] = field(default_factory=dict)  # ws.Connection without a session yet, oldest first
    live: set[Any] = field(default_factory=set)  # every ws.Connection
    meter: LoadMeter = field(default_factory=LoadMeter)  # each session's measured load (admission's cost model)
    engine_meter: LoadMeter = field(default_factory=LoadMeter)  # each session's share of the engine's wall time
    telemetry: Telemetry = field(default_factory=Telemetry.off)  # OpenTelemetry export (web.otel), off by default
    conversations: Conversations = field(default_factory=Conversations)  # each outlives the connection that carries it
    token_store: SqlStore | None = None  # where resume tokens outlive the process (the conversations' database)
    resume: ResumeTokens = field(init=False)  # tokens that carry a dropped connection's conversation on (web.resume)
    _expiring: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        window = self.cfg.server.resume_window_s
        self.resume = ResumeTokens(window, max_held=4 * self.cfg.server.max_sessions, log=self.token_store)
        if self.token_store is not None:  # a restart is the drop of every connection the last process had
            self.token_store.hold_orphans(time.time() + window)

    async def take_resume(self, token: str, auth: str) -> str:
        """The conversation `token` resumes: one held here, or (after a restart) one the database holds, read back
        off the event loop. ValueError saying why not."""
        now = time.time()
        try:
            return self.resume.take(token, auth, now)
        except UnknownToken:
            if self.token_store is None:
                raise
            try:
                saved = await asyncio.to_thread(self.token_store.find_token, token)
            except Exception as exc:  # the database is down: the user gets a new conversation, not a dead socket
                raise ValueError(f"the conversation store did not answer ({exc.__class__.__name__})") from None
            if saved is None:
                raise
        if not hmac.compare_digest(saved.auth_hash, digest(auth)):
            raise ValueError("the resume token was issued to another client")
        if saved.deadline_s is None or now > saved.deadline_s:
            raise ValueError("the resume token expired")
        if self.conversations.get(saved.conversation_id) is None:
            s = self.settings
            try:
                await asyncio.to_thread(self.conversations.open, saved.conversation_id, persona=self.cfg.default_persona,
                                        voice=None, max_chars=s.history_chars, max_messages=s.history_messages, resume=True)  # fmt: skip
            except Exception as exc:
                raise ValueError(f"the conversation could not be read back ({exc.__class__.__name__})") from None
        return saved.conversation_id

    @property
    def stages(self) -> Stages:
        assert self.runtime is not None, "models are not loaded"
        return self.runtime.stages

    def admission(self) -> Admission:
        server = self.cfg.server
        cores = self.runtime.threads.cores if self.runtime is not None and self.runtime.threads else available_cores()
        return Admission.from_config(server.sessions_per_core, cores, server.max_sessions, server.admit_max_wait_ms,
                                     server.admit_v2v_ratio, self.cfg.budgets_ms.get("voice_to_voice"))  # fmt: skip

    def record_turn(self, trace: TurnTrace) -> None:
        """A finished turn: /metrics, /api/traces and the trace log, and its spans when export is on."""
        body = trace.to_dict()
        self.metrics.record_trace(body)
        self.telemetry.turn(trace)
        stages = body["stages_ms"]  # its summary beside the transcript (queued: the database's writer does it)
        self.conversations.store.record_turn(trace.session_id, TurnSummary(
            trace.turn_id, time.time(), str(body.get("input", "")), stages.get("voice_to_voice"), stages.get("llm_ttft"),
            tuple(body["over_budget"])))  # fmt: skip

    def open_session(
        self, session_id: str, settings: SessionSettings, persona: str, voice: str | None, *,
        outbox: Outbox, on_trace: Callable[[TurnTrace], None], user: str = "",
    ) -> Session:  # fmt: skip
        """A connection's session over a conversation of its id (new, or one carried on). `user`: who its user is
        (voice.user_memory's owner; "" none). Raises the session's InputError (an unknown persona or voice) with
        nothing left behind."""
        conversation = self.conversations.open(session_id, persona=persona, voice=voice,
                                               max_chars=settings.history_chars, max_messages=settings.history_messages)  # fmt: skip
        try:
            session = Session(session_id, self.stages, settings, self.personas, persona, voice,
                              outbox=outbox, on_trace=on_trace, conversation=conversation, user=user)  # fmt: skip
        except BaseException:
            if not conversation.attached:
                self.conversations.end(session_id)
            raise
        self.sessions[session_id] = session
        return session

    async def close_session(self, session: Session, resumable: bool = False, handed_over: bool = False) -> None:
        """A connection is gone: its session stops. `resumable` (it dropped, and resuming is on): the conversation
        and its engine slot are held for resume_window_s for a reconnect with its token; `handed_over`: another
        connection resumed it and takes it now; else it ends now."""
        conversation_id = session.session_id
        self.drop_session(conversation_id)
        keep = handed_over or (resumable and self.resume.window_s > 0)
        await session.close(keep=keep)
        if handed_over:
            pass
        elif keep:
            for old in self.resume.hold(conversation_id, time.time()):
                await self._end_held(old)
            task = asyncio.get_running_loop().create_task(self._expire_after(self.resume.window_s))
            self._expiring.add(task)
            task.add_done_callback(self._expiring.discard)
        else:
            self.resume.forget(conversation_id)
            self.conversations.end(conversation_id)
        self.telemetry.session_closed(conversation_id)  # after close: its held traces are in

    async def _expire_after(self, delay_s: float) -> None:
        """Conversations whose reconnect window has passed end: their engine slots are freed."""
        await asyncio.sleep(delay_s + 0.05)
        for conversation_id in self.resume.expired(time.time()):
            await self._end_held(conversation_id)

    async def forget_conversation(self, conversation_id: str) -> None:
        """The user asked: a conversation goes, transcript and all (one held for a reconnect too: its slot is
        freed, its token no longer works). ConversationInUse while a connection carries it."""
        conversation = self.conversations.get(conversation_id)
        if conversation is not None and conversation.attached:
            raise ConversationInUse(f"conversation {conversation_id} is in progress; end its session first")
        self.resume.forget(conversation_id)
        self.conversations.forget(conversation_id)
        if conversation is not None and self.runtime is not None:
            await asyncio.to_thread(self.stages.llm.release, conversation_id)

    async def _end_held(self, conversation_id: str) -> None:
        conversation = self.conversations.get(conversation_id)
        if conversation is not None and not conversation.attached:
            self.conversations.end(conversation_id)
            if self.runtime is not None:
                await asyncio.to_thread(self.stages.llm.release, conversation_id)

    def drop_session(self, session_id: str) -> None:
        """A session ended. The last one leaving clears the recent latencies admission goes by: they were its."""
        self.sessions.pop(session_id, None)
        if self.runtime is not None:
            self.runtime.stages.runner.forget_key(session_id)
        if not self.sessions:
            self.metrics.forget_recent()
            if self.runtime is not None:
                self.runtime.stages.runner.forget_recent()

    def refusal(self) -> str | None:
        """Why the server takes no new session now (web.admission, web.capacity), or None."""
        full = self.refusal_detail()
        return None if full is None else full.reason

    def refusal_detail(self) -> Refusal | None:
        """refusal(), with when a refused user may try again."""
        n = len(self.sessions)
        server = self.cfg.server
        if n >= server.max_sessions:
            return Refusal(f"the server already has {server.max_sessions} sessions", 5000)
        runner = self.runtime.stages.runner if self.runtime is not None else None
        wait_ms = runner.recent_wait_ms() if runner is not None else None
        if not server.admit_cost_model:
            why = self.admission().refusal(n, wait_ms, self.metrics.recent_v2v_p95())
            return None if why is None else Refusal(why, 5000)
        cost = self.cost_model()
        now_s = time.monotonic()
        full = cost.refusal(self.session_loads(now_s), self.engine_loads(now_s))
        if full is not None:
            return full
        why = Admission(0, server.admit_max_wait_ms).refusal(n, wait_ms)  # the machine behind now: catching up
        return None if why is None else Refusal(why, int(max(1000.0, 2 * (wait_ms or 0.0))))

    def cost_model(self) -> CostModel:
        server = self.cfg.server
        cores = self.runtime.threads.cores if self.runtime is not None and self.runtime.threads else available_cores()
        heavy = 1.0 / server.sessions_per_core if server.sessions_per_core > 0 else cores / server.max_sessions
        talking = self.runtime.engine_turn_share if self.runtime is not None else None
        return CostModel(float(cores), heavy, self.meter.tau_s, server.admit_engine_share, talking)

    def session_loads(self, now_s: float | None = None) -> dict[str, float | None]:
        """Each live session's load in cores (None: not measured long enough), from the busy time its engine steps
        and stage jobs took."""
        engine_busy = self._engine_busy()
        runner = self.runtime.stages.runner if self.runtime is not None else None
        stage_busy = dict(runner.busy_s) if runner is not None else {}
        busy = {sid: engine_busy.get(sid, 0.0) + stage_busy.get(sid, 0.0) for sid in self.sessions}
        return self.meter.observe(busy, time.monotonic() if now_s is None else now_s, time.process_time())

    def engine_loads(self, now_s: float | None = None) -> dict[str, float | None]:
        """Each live session's share of the engine's wall time (None: not measured long enough). Not scaled to the
        process's CPU time: a step a shared core stretched kept the others' steps waiting all the same."""
        engine_busy = self._engine_busy()
        busy = {sid: engine_busy.get(sid, 0.0) for sid in self.sessions}
        return self.engine_meter.observe(busy, time.monotonic() if now_s is None else now_s)

    def _engine_busy(self) -> dict[str, float]:
        return self.runtime.stages.llm.busy_seconds()[1] if self.runtime is not None else {}
