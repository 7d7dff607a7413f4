"""What one server holds while it runs: its config, metrics, loaded stages and live sessions, and whether it takes
another session. Shared by the routes (web.app) and the socket handlers (web.ws, web.realtime)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parley import runtime as rt
from parley.config import AppConfig
from parley.thread_budget import available_cores
from voice.session import Session
from voice.stages import PersonaSpec, SessionSettings, Stages
from voice.trace import TurnTrace
from web.admission import Admission
from web.metrics import Metrics
from web.otel.export import Telemetry


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
    telemetry: Telemetry = field(default_factory=Telemetry.off)  # OpenTelemetry export (web.otel), off by default

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
        self.metrics.record_trace(trace.to_dict())
        self.telemetry.turn(trace)

    def drop_session(self, session_id: str) -> None:
        """A session ended. The last one leaving clears the recent latencies admission goes by: they were its."""
        self.sessions.pop(session_id, None)
        if not self.sessions:
            self.metrics.forget_recent()
            if self.runtime is not None:
                self.runtime.stages.runner.forget_recent()

    def refusal(self) -> str | None:
        """Why the server takes no new session now (web.admission), or None."""
        n = len(self.sessions)
        if n >= self.cfg.server.max_sessions:
            return f"the server already has {self.cfg.server.max_sessions} sessions"
        runner = self.runtime.stages.runner if self.runtime is not None else None
        return self.admission().refusal(n, runner.recent_wait_ms() if runner is not None else None,
                                        self.metrics.recent_v2v_p95())  # fmt: skip
