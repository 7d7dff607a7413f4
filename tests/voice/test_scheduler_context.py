"""A shared-stage job runs in its caller's context (contextvars), as asyncio.to_thread would run it: what a session
set for its own tasks (the OpenTelemetry span a remote stage's request names in `traceparent`) reaches the worker."""
from __future__ import annotations

import asyncio
import contextvars

from voice.scheduler import StageScheduler
from voice.stage_queue import Policy, Priority

SESSION: contextvars.ContextVar[str] = contextvars.ContextVar("session", default="none")


async def test_each_job_sees_its_callers_context() -> None:
    sched = StageScheduler(Policy(workers=1, partial_workers=1, background_workers=1))

    async def caller(name: str) -> str:
        SESSION.set(name)
        ran = await sched.run("asr", Priority.WAITED, name, SESSION.get)
        return ran.value

    try:
        got = await asyncio.gather(*(asyncio.create_task(caller(f"s{i}")) for i in range(6)))
    finally:
        sched.close()
    assert got == [f"s{i}" for i in range(6)] and SESSION.get() == "none"


async def test_the_remote_stages_send_the_current_trace_context() -> None:
    from opentelemetry import context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import set_span_in_context

    from voice.remote.client import trace_headers

    assert contextvars.Context().run(trace_headers) == {}  # no span: no header
    span = TracerProvider().get_tracer("t").start_span("session", context=context.Context())
    token = context.attach(set_span_in_context(span))
    sched = StageScheduler(Policy(workers=1, partial_workers=1, background_workers=1))
    try:
        headers = (await sched.run("tts", Priority.WAITED, "k", trace_headers)).value
    finally:
        sched.close()
        context.detach(token)
    ctx = span.get_span_context()
    assert headers["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")  # then the flags
