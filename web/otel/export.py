"""Turn span trees (web.otel.spans) out over OTLP (HTTP/protobuf or gRPC) with the OpenTelemetry SDK: one span per session, its turns
below it. Off unless an endpoint is configured. Nothing here waits on the collector: spans go to a bounded queue that
a background thread drains; past the bound new spans are dropped and counted (docs/observability.md).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from parley.config import ObservabilityConfig
from voice.trace import TurnTrace, now_ns
from web.otel.spans import LlmFacts, SpanSpec, turn_spans

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)
ENV_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
ENV_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
PROTOCOLS = ("http/protobuf", "grpc")


def traces_url(endpoint: str) -> str:
    """A collector's base URL gets OTLP/HTTP's traces path; a URL with a path is taken as it is."""
    return endpoint.rstrip("/") + "/v1/traces" if urlsplit(endpoint).path in ("", "/") else endpoint


def export_protocol(cfg: ObservabilityConfig, env: Mapping[str, str]) -> str:
    """http/protobuf or grpc: the config's, else the standard variables' (an unknown one is said and not used)."""
    if cfg.otlp_protocol is not None:
        return cfg.otlp_protocol
    for key in ENV_PROTOCOLS:
        value = env.get(key, "").strip().lower()
        if value in PROTOCOLS:
            return value
        if value:
            log.warning("%s=%s is not an OTLP protocol Parley exports (%s): using http/protobuf", key, value, ", ".join(PROTOCOLS))
            break
    return "http/protobuf"


def export_target(cfg: ObservabilityConfig, env: Mapping[str, str]) -> str | None:
    """Where spans go: the config's endpoint (OTLP/HTTP's traces path added to a base URL; gRPC takes the address as
    it is), else the standard variables' ("env"), else None (export off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if cfg.otlp_endpoint:
        return cfg.otlp_endpoint if export_protocol(cfg, env) == "grpc" else traces_url(cfg.otlp_endpoint)
    return "env" if any(env.get(k) for k in ENV_ENDPOINTS) else None


class SpanCounts:
    """Spans by fate, for /metrics: waiting (in the queue or being sent), exported, dropped (queue full or after
    shutdown), failed (the collector refused, timed out or could not be reached)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting = self.exported = self.dropped = self.failed = 0


class Telemetry:
    """The server's span export. `Telemetry.off()` (or no endpoint) does nothing at all."""

    def __init__(self, cfg: ObservabilityConfig, llm: LlmFacts, env: Mapping[str, str] | None = None) -> None:
        self.cfg = cfg
        self.llm = llm
        self.counts = SpanCounts()
        env = os.environ if env is None else env
        self.target = export_target(cfg, env)
        self.protocol = export_protocol(cfg, env)
        # the standard variable names the process when set (one config shared by differently named processes)
        self.service_name = env.get("OTEL_SERVICE_NAME") or cfg.service_name
        self._sessions: dict[str, Span] = {}
        self._tracer: Any = None
        self._provider: Any = None
        # the trace's marks are perf-counter ns; spans need wall-clock ns
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        if self.target is not None:
            self._start()

    @classmethod
    def off(cls) -> "Telemetry":
        return cls(ObservabilityConfig(), LlmFacts("", ""), env={})

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @property
    def tracer(self) -> Any:
        """The SDK tracer while export is on, else None (web.otel.requests makes its request spans with it)."""
        return self._tracer

    def _start(self) -> None:
        if self.protocol == "grpc":  # (http:// is a plaintext channel, https:// TLS)
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        cfg = self.cfg
        headers = {k.lower(): v for k, v in cfg.headers.items()} if self.protocol == "grpc" else cfg.headers  # gRPC metadata keys are lowercase
        exporter = OTLPSpanExporter(endpoint=None if self.target == "env" else self.target, headers=headers or None,
                                    timeout=cfg.export_timeout_s)  # fmt: skip
        provider = TracerProvider(resource=Resource.create({"service.name": self.service_name}),
                                  sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio)))  # fmt: skip
        provider.add_span_processor(_bounded_processor(exporter, cfg, self.counts))
        self._provider = provider
        self._tracer = provider.get_tracer("parley")
        log.info("OpenTelemetry export to %s over %s (sampling %.2f)", self.target, self.protocol, cfg.sample_ratio)

    # -- from the sessions (event loop; each call only builds spans and queues them) --------------------------

    def session_opened(self, session_id: str, **attrs: Any) -> None:
        """The session's span starts and becomes current in the calling task, whose context every task it starts
        copies: a remote stage's request made for this session carries its `traceparent` (voice.remote.llm)."""
        if self._tracer is None:
            return
        from opentelemetry import context
        from opentelemetry.trace import set_span_in_context

        # a root (an empty context): each conversation is one trace, whatever the caller had current
        attributes = {"parley.session_id": session_id, "gen_ai.conversation.id": session_id,
                      **{f"parley.session.{k}": v for k, v in attrs.items() if v is not None}}  # fmt: skip
        span = self._tracer.start_span("parley.session", context=context.Context(), start_time=now_ns() + self._offset_ns,
                                       attributes=attributes)  # fmt: skip
        self._sessions[session_id] = span
        context.attach(set_span_in_context(span))  # never detached: the connection's task ends with the session

    def session_closed(self, session_id: str) -> None:
        span = self._sessions.pop(session_id, None)
        if span is not None:
            span.end(end_time=now_ns() + self._offset_ns)

    def turn(self, trace: TurnTrace) -> None:
        """A finished turn's spans, under its session's span (or a trace of their own when the session has none)."""
        if self._tracer is None:
            return
        spec = turn_spans(trace, self.llm, self.cfg.include_text)
        if spec is None:
            return
        from opentelemetry.trace import set_span_in_context

        parent = self._sessions.get(trace.session_id)
        self._emit(spec, set_span_in_context(parent) if parent is not None else None)

    def _emit(self, spec: SpanSpec, context: Any) -> None:
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        off = self._offset_ns
        span = self._tracer.start_span(spec.name, context=context, start_time=spec.start_ns + off, attributes=spec.attributes)
        for ev in spec.events:
            span.add_event(ev.name, ev.attributes, timestamp=ev.t_ns + off)
        if spec.error is not None:
            span.set_status(Status(StatusCode.ERROR, spec.error))
        child_context = set_span_in_context(span)
        for child in spec.children:
            self._emit(child, child_context)
        span.end(end_time=spec.end_ns + off)

    # -- for /metrics and the server's end ---------------------------------------------------------------------

    def exposition(self) -> str:
        """Prometheus text for /metrics ("" while export is off)."""
        if self._provider is None:
            return ""
        c = self.counts
        with c.lock:
            fates = {"exported": c.exported, "dropped": c.dropped, "failed": c.failed}
            waiting = c.waiting
        lines = ["# HELP parley_otel_spans_total Spans by fate: exported, dropped (queue full), failed (not taken).",
                 "# TYPE parley_otel_spans_total counter"]  # fmt: skip
        lines += [f'parley_otel_spans_total{{outcome="{k}"}} {v}' for k, v in fates.items()]
        lines += ["# HELP parley_otel_queue_spans Spans waiting for export (bounded by observability.max_queue_spans).",
                  "# TYPE parley_otel_queue_spans gauge", f"parley_otel_queue_spans {waiting}"]  # fmt: skip
        return "\n".join(lines) + "\n"

    def shutdown(self) -> None:
        """Ends open session spans and sends what is queued, for at most one export timeout (blocking: run it off
        the event loop)."""
        if self._provider is None:
            return
        for session_id in list(self._sessions):
            self.session_closed(session_id)
        self._provider.shutdown()
        self._tracer = None


def _bounded_processor(exporter: Any, cfg: ObservabilityConfig, counts: SpanCounts) -> Any:
    """The SDK's BatchSpanProcessor behind a gate that counts: the SDK's own queue drops silently when full, so the
    gate drops first (and counts) once `max_queue_spans` wait; the exporter is wrapped to count what it sent."""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        def __init__(self) -> None:
            self.deadline_s: float | None = None  # set at shutdown: past it nothing more is sent

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            n = len(spans)
            with counts.lock:
                counts.waiting -= n
            if self.deadline_s is not None and time.monotonic() > self.deadline_s:
                result = SpanExportResult.FAILURE
            else:
                try:
                    result = exporter.export(spans)
                except Exception:  # noqa: BLE001  an exporter's error is a failed export, never the worker's end
                    log.warning("OTLP export failed", exc_info=True)
                    result = SpanExportResult.FAILURE
            with counts.lock:
                if result is SpanExportResult.SUCCESS:
                    counts.exported += n
                else:
                    counts.failed += n
            return result

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    class Gate(SpanProcessor):
        def __init__(self) -> None:
            self.exporter = CountingExporter()
            self.closed = False
            self.inner = BatchSpanProcessor(self.exporter, max_queue_size=cfg.max_queue_spans,
                                            schedule_delay_millis=cfg.schedule_delay_ms,
                                            max_export_batch_size=min(cfg.max_export_batch, cfg.max_queue_spans),
                                            export_timeout_millis=cfg.export_timeout_s * 1000)  # fmt: skip

        def on_end(self, span: ReadableSpan) -> None:
            if span.context is None or not span.context.trace_flags.sampled:
                return
            with counts.lock:
                if self.closed or counts.waiting >= cfg.max_queue_spans:
                    counts.dropped += 1
                    return
                counts.waiting += 1
            self.inner.on_end(span)

        def shutdown(self) -> None:
            with counts.lock:
                self.closed = True
            self.exporter.deadline_s = time.monotonic() + cfg.export_timeout_s
            self.inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return self.inner.force_flush(timeout_millis)

    return Gate()


def llm_facts(cfg: Any) -> LlmFacts:
    """The LLM's name and provider for gen_ai.* attributes, from the app config (parley.config.AppConfig)."""
    llm = cfg.models.llm
    if llm.backend == "openai" and llm.remote is not None:
        return LlmFacts(llm.remote.model or "default", "openai")
    from parley.embedded_llms import embedded_llm

    embedded = embedded_llm(llm.source)
    name = embedded.model.split(" (")[0] if embedded is not None else os.path.basename(llm.source.rstrip("/"))
    return LlmFacts(name, "parley")
