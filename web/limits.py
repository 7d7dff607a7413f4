"""Who may come in and how much they may send: Host and Origin checks, the token, and token-bucket rate limits.

Pure functions and a small class over headers, strings and clocks; no sockets, no sessions.
"""
from __future__ import annotations

import hmac
import time
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
TOKEN_COOKIE = "parley_token"


class RateLimiter:
    """Token bucket: `rate` units a second refilled by wall time, a burst of `burst_s` seconds' worth.

    Refill is measured between reads, and a server that stalled did not read: a well-behaved client's
    messages from the stall then arrive all at once. So the bucket may hold what the time since the last
    read earned (up to `stall_s` seconds' worth) on top of the burst: a backlog after a stall passes, while a
    client that keeps sending faster than `rate` empties the bucket and is refused. A unit is a message, or
    (for audio) a second of it: a microphone sends exactly at the rate, with no slack for a backlog otherwise.
    """

    def __init__(self, rate: float, burst_s: float = 1.0, stall_s: float = 10.0) -> None:
        self.rate = rate
        self.burst = rate * burst_s
        self.max_credit = rate * max(burst_s, stall_s)
        self.tokens = self.burst
        self.last = time.monotonic()

    def allow(self, now: float | None = None, cost: float = 1.0) -> bool:
        now = time.monotonic() if now is None else now
        earned = max(0.0, now - self.last) * self.rate
        self.last = now
        # accrual stops at the burst plus what this one gap earned (a stall's backlog); credit already held above
        # it is kept until spent, so the backlog drains over the following reads
        cap = max(self.burst + min(earned, self.max_credit), self.tokens)
        self.tokens = min(self.tokens + earned, cap)
        # A gap of exactly cost/rate can earn 0.99999999... of it in floating point (the clock's value is large,
        # its differences lose the low bits): a client sending at exactly the rate is not refused for that.
        if self.tokens >= cost - 1e-6:
            self.tokens = max(0.0, self.tokens - cost)
            return True
        return False


def origin_allowed(origin: str | None, host: str | None, allowed: tuple[str, ...] | list[str]) -> bool:
    """No Origin (not a browser), a configured one, or the page's own server: an Origin whose host:port is the
    request's Host header (a page Parley served, whatever address or port it runs on)."""
    if origin is None or origin in allowed:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or host is None:
        return False
    default_port = {"http": 80, "https": 443}[parts.scheme]
    theirs, ours = _host_port(parts.netloc, default_port), _host_port(host, default_port)
    return theirs is not None and theirs == ours


def host_allowed(host_header: str | None, allowed: Iterable[str]) -> bool:
    """The request's Host names this server: one of `allowed` (host names, any port), so a page on another
    name that resolves here (DNS rebinding) is refused. No Host header (HTTP/1.0, raw clients) is allowed."""
    if host_header is None:
        return True
    hp = _host_port(host_header, 0)
    return hp is not None and hp[0] in {h.lower().strip("[]") for h in allowed}


def _host_port(netloc: str, default_port: int) -> tuple[str, int] | None:
    try:
        parts = urlsplit("//" + netloc.strip())
        return (parts.hostname or "").lower(), parts.port or default_port
    except ValueError:  # a malformed port
        return None


def given_token(query: Mapping[str, str], headers: Mapping[str, str], cookies: Mapping[str, str]) -> str | None:
    """The token a request carries: `Authorization: Bearer`, else `?token=`, else the page's cookie."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return query.get("token") or cookies.get(TOKEN_COOKIE)


def token_ok(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())
