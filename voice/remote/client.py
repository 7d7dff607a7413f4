"""What every remote stage shares: the server's settings, its key, and one error type the session reports."""
from __future__ import annotations

import os
from dataclasses import dataclass


def trace_headers() -> dict[str, str]:
    """The current OpenTelemetry context as a `traceparent` header (none when no span is current, or export is off),
    so the stage server's span joins the caller's trace (docs/observability.md)."""
    from opentelemetry import propagate

    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


class RemoteStageError(RuntimeError):
    """A remote stage failed (down, timed out, refused): the session reports it and goes on."""


@dataclass(frozen=True)
class RemoteSpec:
    base_url: str
    model: str = ""
    api_key_env: str | None = None
    timeout_s: float = 30.0

    def api_key(self) -> str:
        """The key from the named environment variable; a server without auth still needs a non-empty one."""
        if self.api_key_env is None:
            return "none"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise RemoteStageError(f"the environment variable {self.api_key_env} (the key for {self.base_url}) is not set")
        return key

    def describe(self, exc: BaseException) -> str:
        status = getattr(exc, "status_code", None)
        reason = f"HTTP {status}" if status else type(exc).__name__
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        return f"{self.base_url}: {reason}" + (f": {detail}" if detail else "")
