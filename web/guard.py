"""The gate in front of every route: a Host the server answers to, and (when `server.token` is set) the token.

ASGI middleware over web.limits' checks. A foreign Host (a page on another name that resolves here: DNS
rebinding) gets 421; a request without the token gets 401, except /healthz. A page loaded with `?token=` is
answered with the token as a cookie, so the page's own scripts, styles and API calls carry it. /ws checks its
token itself, to tell a browser why in an `error` message.
"""
from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl

from web.limits import LOOPBACK_HOSTS, TOKEN_COOKIE, given_token, host_allowed, token_ok

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
OPEN_PATHS = ("/healthz",)


class Guard:
    def __init__(self, app: ASGIApp, *, hosts: Iterable[str], token: str | None) -> None:
        self.app = app
        self.hosts = None if "*" in hosts else {*LOOPBACK_HOSTS, *hosts}
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.hosts is not None and not host_allowed(headers.get("host"), self.hosts):
            return await _refuse(scope, receive, send, 421, "misdirected_request", "this server does not answer to that Host")
        if self.token is None or scope["type"] == "websocket" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        cookie = SimpleCookie(headers.get("cookie", ""))
        given = given_token(query, headers, {k: m.value for k, m in cookie.items()})
        if not token_ok(given, self.token):
            return await _refuse(scope, receive, send, 401, "unauthorized", "missing or wrong token (?token=, Bearer or the page's cookie)")
        if query.get("token") and TOKEN_COOKIE not in cookie:
            send = _with_cookie(send, self.token)
        await self.app(scope, receive, send)


def _with_cookie(send: Send, token: str) -> Send:
    async def sending(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            cookie = f"{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
            message["headers"] = [*message.get("headers", []), (b"set-cookie", cookie.encode("latin-1"))]
        await send(message)

    return sending


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, code: str, message: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})  # before accept: the handshake is refused
        return
    # OpenAI's error shape, so its SDKs raise their own AuthenticationError on a wrong key
    body = json.dumps({"error": {"message": message, "type": code, "param": None, "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})
