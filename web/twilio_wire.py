"""Twilio Media Streams' messages (bidirectional `<Connect><Stream>`): the events Twilio sends, validated with
pydantic, and the ones Parley sends back. Pure; no sockets. Reference: Twilio's "Media Streams - WebSocket
Messages" (connected, start, media, mark, dtmf, stop in; media, mark, clear out)."""
from __future__ import annotations

import base64
import binascii
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_CHUNK_BYTES = 8000  # one second of μ-law; Twilio sends 160 bytes (20 ms) a message


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class MediaFormat(_Wire):
    encoding: Literal["audio/x-mulaw"] = "audio/x-mulaw"
    sample_rate: Literal[8000] = Field(8000, alias="sampleRate")
    channels: Literal[1] = 1


class StartInfo(_Wire):
    stream_sid: str = Field("", alias="streamSid", max_length=100)
    call_sid: str = Field("", alias="callSid", max_length=100)
    account_sid: str = Field("", alias="accountSid", max_length=100)
    tracks: list[str] = Field(default_factory=lambda: ["inbound"], max_length=4)
    media_format: MediaFormat = Field(default_factory=MediaFormat, alias="mediaFormat")
    custom_parameters: dict[str, str] = Field(default_factory=dict, alias="customParameters", max_length=32)


class Start(_Wire):
    event: Literal["start"]
    stream_sid: str = Field("", alias="streamSid", max_length=100)
    start: StartInfo


class MediaInfo(_Wire):
    track: str = "inbound"
    payload: str = Field(max_length=MAX_CHUNK_BYTES * 4 // 3 + 4)


class Media(_Wire):
    event: Literal["media"]
    media: MediaInfo


class MarkInfo(_Wire):
    name: str = Field(max_length=200)


class Mark(_Wire):
    event: Literal["mark"]
    mark: MarkInfo


class Other(_Wire):
    event: Literal["connected", "stop", "dtmf"]


Event = Start | Media | Mark | Other


class WireError(Exception):
    pass


def parse(text: str) -> Event:
    """One Twilio message -> its event. Raises WireError with a clear reason."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise WireError("not JSON") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("event"), str):
        raise WireError("a message is a JSON object with a string `event`")
    model = {"start": Start, "media": Media, "mark": Mark}.get(raw["event"], Other)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"])[:80]
        raise WireError(f"{raw['event'][:40]}: {where}: {e['msg']}") from None


def payload(media: Media) -> bytes:
    """A media event's μ-law bytes."""
    try:
        return base64.b64decode(media.media.payload, validate=True)
    except (binascii.Error, ValueError):
        raise WireError("media.payload: not valid base64") from None


def media_out(stream_sid: str, ulaw: bytes) -> str:
    return json.dumps({"event": "media", "streamSid": stream_sid, "media": {"payload": base64.b64encode(ulaw).decode()}})


def mark_out(stream_sid: str, name: str) -> str:
    return json.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear_out(stream_sid: str) -> str:
    return json.dumps({"event": "clear", "streamSid": stream_sid})


def mark_name(turn_id: int, played_ms: float) -> str:
    """The name of the mark sent after a reply's audio: Twilio echoes it once that much has been played."""
    return f"parley:{turn_id}:{played_ms:.0f}"


def parse_mark(name: str) -> tuple[int, float] | None:
    """(turn, played_ms) of a mark Parley named, or None for a name it did not give."""
    parts = name.split(":")
    if len(parts) != 3 or parts[0] != "parley":
        return None
    try:
        return int(parts[1]), float(parts[2])
    except ValueError:
        return None
