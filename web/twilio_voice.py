"""/twilio/voice: the webhook Twilio calls when the number rings. Checks Twilio's request signature (the `twilio`
package's RequestValidator, when `twilio.auth_token_env` names a set variable) and answers TwiML that connects
the call to /twilio/stream (web.twilio), passing the server's token as a stream parameter.
"""
from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from starlette.requests import Request
from starlette.responses import Response
from twilio.request_validator import RequestValidator
from twilio.twiml.voice_response import Connect, Stream, VoiceResponse

from parley.config import AppConfig

STREAM_PATH = "/twilio/stream"
MAX_FORM_BYTES = 64 * 1024  # Twilio's webhook form is a few hundred bytes


def auth_token(cfg: AppConfig) -> str | None:
    """The account's auth token, when the config names its variable. Raises RuntimeError when that is unset."""
    name = cfg.twilio.auth_token_env
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"twilio.auth_token_env names {name}, which is not set")
    return value


def public(cfg: AppConfig, url: str) -> str:
    """`url` as Twilio requested it: behind a proxy, `twilio.public_url`'s scheme and host (wss for a socket)."""
    base = cfg.twilio.public_url
    if base is None:
        return url
    ours, theirs = urlsplit(url), urlsplit(base)
    scheme = "wss" if ours.scheme in ("ws", "wss") else theirs.scheme
    return urlunsplit((scheme, theirs.netloc, ours.path, ours.query, ""))


def signature_ok(cfg: AppConfig, url: str, params: dict[str, str], signature: str | None) -> bool:
    """Whether Twilio signed this request (always true when no auth token is configured)."""
    token = auth_token(cfg)
    if token is None:
        return True
    return signature is not None and RequestValidator(token).validate(public(cfg, url), params, signature)


def stream_url(cfg: AppConfig, request: Request) -> str:
    if cfg.twilio.public_url is not None:
        return public(cfg, "wss://host" + STREAM_PATH)
    scheme = "wss" if request.url.scheme == "https" else "ws"
    return f"{scheme}://{request.headers.get('host', request.url.netloc)}{STREAM_PATH}"


async def voice_webhook(request: Request, cfg: AppConfig) -> Response:
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return Response("form too large", status_code=413)
    params = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    try:
        ok = signature_ok(cfg, str(request.url), params, request.headers.get("x-twilio-signature"))
    except RuntimeError as exc:  # configured to check, without the token to check with
        return Response(str(exc), status_code=500)
    if not ok:
        return Response("invalid or missing X-Twilio-Signature", status_code=403)
    stream = Stream(url=stream_url(cfg, request))
    if cfg.server.token:
        stream.parameter(name="token", value=cfg.server.token)
    connect = Connect()
    connect.append(stream)
    twiml = VoiceResponse()
    twiml.append(connect)
    return Response(str(twiml), media_type="application/xml")
