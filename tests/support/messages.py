"""Messages a test collects from a session (over a socket or straight from its outbox), and waiting for one."""
from __future__ import annotations

import asyncio
from typing import Any


class MessageLog:
    """Mixed into a test client: it appends each message to `self.messages` and sets `self._changed`."""

    messages: list[dict[str, Any]]
    _changed: asyncio.Event
    wait_timeout_s = 10.0  # a safety net against a hang, never a speed assertion

    def of(self, kind: str, turn_id: int | None = None) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind and (turn_id is None or m.get("turn_id") == turn_id)]

    def types(self) -> list[str]:
        """Message types in order, runs of the same type collapsed (deltas, audio, partials)."""
        out: list[str] = []
        for m in self.messages:
            if not out or out[-1] != m["type"]:
                out.append(m["type"])
        return out

    def ended(self) -> str | None:
        """Why no more messages can come (the connection closed), or None."""
        return None

    async def wait_for(self, kind: str, n: int = 1, timeout_s: float | None = None, turn_id: int | None = None) -> dict[str, Any]:
        """The n-th message of `kind` (of `turn_id`, if given)."""
        async with asyncio.timeout(self.wait_timeout_s if timeout_s is None else timeout_s):
            while len(self.of(kind, turn_id)) < n:
                why = self.ended()
                if why is not None:
                    raise AssertionError(f"{why} before {kind}; got {self.types()} {self.of('error')}")
                self._changed.clear()
                await self._changed.wait()
        return self.of(kind, turn_id)[n - 1]
