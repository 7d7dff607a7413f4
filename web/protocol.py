"""Wire protocol v1 (docs/protocol.md): validated client messages, server message encoding, audio header.

Pure: turns bytes/str into typed messages or a ProtocolError carrying an error code; knows no sockets or sessions.
"""
from __future__ import annotations

import json
import struct
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

PROTOCOL_VERSION = 1
AUDIO_HEADER = struct.Struct("<II")  # turn_id uint32 LE, seq uint32 LE
SUPPORTED_INPUT_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
MAX_AUDIO_MESSAGE_S = 1.0
MAX_TEXT_CHARS = 2000
MAX_NAME_CHARS = 100  # persona and voice names
MAX_TURN_ID = 2**31 - 1
MAX_PLAYED_MS = 3_600_000.0  # an hour of one reply's audio: anything more is not a playback position
ECHO_CHARS = 80  # how much of a client's bad value an error message quotes

# Close codes (RFC 6455 plus the registered 1013).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN = 1013
CLOSE_INTERNAL = 1011


class ProtocolError(Exception):
    """Bad client input: `code` goes into the `error` message; `fatal` ends the session."""

    def __init__(self, code: str, message: str, *, fatal: bool = False, close_code: int = CLOSE_POLICY,
                 extra: dict[str, Any] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal
        self.close_code = close_code
        self.extra = extra or {}  # more fields of the error message (server_full: retry_after_ms)


def clip(value: object, limit: int = ECHO_CHARS) -> str:
    """A client's value as an error message may quote it: repr'd and cut short."""
    return shorten(repr(value), limit)


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]


class SessionStart(_Msg):
    type: Literal["session.start"]
    protocol: int
    sample_rate: int = 16000
    persona: Name | None = None
    voice: Name | None = None
    echo_cancelled: bool = False  # the client takes its own echo out (a browser's AEC): the server's canceller is not run
    resume: str | None = Field(None, max_length=64)  # a dropped connection's resume_token: carry its conversation on
    # who the client's user is (a random id the client keeps): a persona with `memory: true` remembers them by it,
    # under the auth token (docs/protocol.md, Memory)
    user: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")


class InputText(_Msg):
    type: Literal["input.text"]
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class ResponseCancel(_Msg):
    type: Literal["response.cancel"]


class PlaybackMark(_Msg):
    type: Literal["playback.mark"]
    turn_id: int = Field(ge=0, le=MAX_TURN_ID)
    played_ms: float = Field(ge=0, le=MAX_PLAYED_MS)
    paused: bool = False  # playback is paused here (speech over the reply) until the next mark
    # the client's own playback start (docs/protocol.md, Client playback start): ms from the turn's first audio message
    # arriving to its first sample played, and the times it has run dry part-way; the server's trace carries them
    start_ms: float | None = Field(default=None, ge=0, le=MAX_PLAYED_MS)
    underruns: int | None = Field(default=None, ge=0, le=1_000_000)


class SessionUpdate(_Msg):
    type: Literal["session.update"]
    persona: Name | None = None
    voice: Name | None = None


ClientMessage = Annotated[
    Union[SessionStart, InputText, ResponseCancel, PlaybackMark, SessionUpdate], Field(discriminator="type")
]
_CLIENT = TypeAdapter(ClientMessage)
CLIENT_TYPES = ("session.start", "input.text", "response.cancel", "playback.mark", "session.update")

# Server -> client: the fields each type must carry (checked in encode so a typo cannot reach a client).
SERVER_FIELDS: dict[str, tuple[str, ...]] = {
    "session.ready": ("session_id", "resume_token", "resumed", "protocol", "input_sample_rate", "output_sample_rate", "persona", "voice", "personas", "voices"),
    "session.updated": ("persona", "voice"),
    "vad.speech_started": ("turn_id", "t_ms"),
    "vad.speech_ended": ("turn_id", "t_ms"),
    "transcript.partial": ("turn_id", "text"),
    "transcript.final": ("turn_id", "text"),
    "response.text.delta": ("turn_id", "text"),
    "response.audio.clear": ("turn_id",),
    "response.resumed": ("turn_id", "interjection", "t_ms", "reason"),
    "turn.joined": ("turn_id", "joins"),
    "response.done": ("turn_id", "text", "interrupted", "spoken_text"),
    "turn.trace": ("turn_id", "marks_ms", "stages_ms", "budgets_ms", "over_budget"),
    "error": ("code", "message", "fatal"),
}


def parse_text(raw: str) -> ClientMessage:
    """One client text message -> a typed message; ProtocolError(bad_json | unknown_type | invalid_message)."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # JSONDecodeError, NaN/Infinity, an integer of thousands of digits
        raise ProtocolError("bad_json", "message is not valid JSON (or holds NaN, Infinity or a huge number)") from None
    if not isinstance(data, dict):
        raise ProtocolError("bad_json", "message must be a JSON object")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in CLIENT_TYPES:
        raise ProtocolError("unknown_type", f"unknown message type {clip(kind)} (known: {', '.join(CLIENT_TYPES)})")
    try:
        msg = _CLIENT.validate_python(data)
    except ValidationError as err:
        e = err.errors()[0]
        where = shorten(".".join(str(p) for p in e["loc"][1:]) or "(message)")  # a field name is the client's text too
        raise ProtocolError("invalid_message", f"{kind}: {where}: {e['msg']}") from None
    if isinstance(msg, SessionStart):
        check_start(msg)
    return msg


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def check_start(msg: SessionStart) -> None:
    if msg.protocol != PROTOCOL_VERSION:
        raise ProtocolError(
            "bad_protocol_version",
            f"protocol {clip(msg.protocol)} is not supported; this server speaks protocol {PROTOCOL_VERSION}",
            fatal=True,
            close_code=CLOSE_PROTOCOL_ERROR,
        )
    if msg.sample_rate not in SUPPORTED_INPUT_RATES:
        raise ProtocolError("bad_sample_rate", f"sample_rate must be one of {SUPPORTED_INPUT_RATES}, got {clip(msg.sample_rate)}")


def check_audio(data: bytes, sample_rate: int) -> None:
    """A client audio message: PCM16LE mono, even length, at most 1 s."""
    if len(data) % 2:
        raise ProtocolError("bad_audio", f"audio message has odd length {len(data)}; PCM16 needs 2 bytes a sample")
    max_bytes = int(sample_rate * MAX_AUDIO_MESSAGE_S) * 2
    if len(data) > max_bytes:
        raise ProtocolError(
            "audio_too_long", f"audio message holds {len(data) // 2} samples; at most {max_bytes // 2} (1 s) per message"
        )


def encode(kind: str, **fields: Any) -> str:
    """A server message as JSON text; raises KeyError naming a missing field (a server bug, not client input)."""
    required = SERVER_FIELDS[kind]
    missing = [f for f in required if f not in fields]
    if missing:
        raise KeyError(f"{kind}: missing {missing}")
    return json.dumps({"type": kind, **fields}, separators=(",", ":"))


def error_message(code: str, message: str, fatal: bool = False, **extra: Any) -> str:
    return encode("error", code=code, message=message, fatal=fatal, **extra)


def pack_audio(turn_id: int, seq: int, pcm16: bytes) -> bytes:
    return AUDIO_HEADER.pack(turn_id & 0xFFFFFFFF, seq & 0xFFFFFFFF) + pcm16


def unpack_audio(data: bytes) -> tuple[int, int, bytes]:
    """Server audio message -> (turn_id, seq, pcm16 bytes); for clients and tests."""
    if len(data) < AUDIO_HEADER.size:
        raise ValueError(f"audio message shorter than its {AUDIO_HEADER.size}-byte header")
    turn_id, seq = AUDIO_HEADER.unpack_from(data)
    return turn_id, seq, data[AUDIO_HEADER.size :]
