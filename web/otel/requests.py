"""Spans for the OpenAI-compatible stage requests (`parley stages`, or `parley serve` with openai_api): one server
span per request, a child of the caller's `traceparent` when it sent one, so a split deployment's turn shows its
remote stages in the same trace. The chat route adds GenAI's usage attributes to the current span.
"""
from __future__ import annotations

from typing import Any

from voice.llm_bridge import LlmFinish
from web.otel.export import Telemetry

# path -> gen_ai.operation.name
ROUTES = {"/v1/chat/completions": "chat", "/v1/audio/transcriptions": "transcription", "/v1/audio/speech": "speech"}


class RequestSpans:
    """Pure ASGI middleware (it must not buffer a streamed reply): the span lasts until the response's last byte."""

    def __init__(self, app: Any, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        tracer = self.telemetry.tracer
        if scope["type"] != "http" or tracer is None or scope["path"] not in ROUTES:
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method, path = scope.get("method", "POST"), scope["path"]
        span = tracer.start_span(f"{method} {path}", context=propagate.extract(carrier), kind=SpanKind.SERVER, attributes={
            "http.request.method": method, "url.path": path, "gen_ai.operation.name": ROUTES[path]})  # fmt: skip
        token = context.attach(set_span_in_context(span))
        status = 500  # unless a response starts

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            context.detach(token)
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            span.end()


def annotate_chat(model: str, fin: LlmFinish) -> None:
    """The chat completion's GenAI attributes on the request's span (nothing when no span is recording)."""
    from opentelemetry import trace

    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.update_name(f"chat {model}")
    span.set_attributes({
        "gen_ai.provider.name": "parley", "gen_ai.request.model": model,
        "gen_ai.usage.input_tokens": fin.prefill_tokens + fin.reused_tokens,
        "gen_ai.usage.cache_read.input_tokens": fin.reused_tokens, "gen_ai.usage.output_tokens": fin.generated_tokens,
        "gen_ai.response.finish_reasons": [fin.reason], "gen_ai.response.time_to_first_chunk": fin.prefill_ms / 1000.0,
    })  # fmt: skip
