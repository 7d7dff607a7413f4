"""A Realtime session's configuration: what `session.update` may set (pydantic at the wire), what it means for
Parley's session (a turn policy, a voice, instructions), and the effective configuration sent back in
`session.created` / `session.updated`. Pure: no sockets, no session.

Turn detection maps onto Parley's turn-taking: `server_vad` is a fixed silence (`silence_duration_ms`), as
OpenAI's is; `semantic_vad` is Parley's own end-of-turn judgment (the engine's reading of the words and the
Smart Turn audio model), its `eagerness` setting the longest pause a turn may hold; null is manual commits.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_engine.tool_format import ToolSpec
from voice.codec import G711_RATE
from web.realtime.tools import choice_name, tool_specs, wire_choice
from voice.turn_policy import TurnPolicy

RATE = 24000  # OpenAI's audio/pcm: 16-bit mono little-endian at 24 kHz, in and out
EAGERNESS_HANGOVER_MS = {"low": 3000, "medium": 1500, "high": 800}  # the longest pause a turn holds
NEVER_MS = 1e9  # interrupt_response false: speech during a reply never interrupts it


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AudioFormat(_Wire):
    """audio/pcm: PCM16 at 24 kHz; audio/pcmu, audio/pcma: G.711 μ-law / A-law at 8 kHz (no rate)."""

    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: Literal[24000, 8000] | None = None

    @model_validator(mode="after")
    def _rate_of_type(self) -> "AudioFormat":
        if self.rate is not None and self.rate != (RATE if self.type == "audio/pcm" else G711_RATE):
            raise ValueError(f"{self.type} is at {RATE if self.type == 'audio/pcm' else G711_RATE} Hz, not {self.rate}")
        return self


BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}


class TurnDetectionIn(_Wire):
    type: Literal["server_vad", "semantic_vad"]
    threshold: float | None = Field(None, ge=0.0, le=1.0)
    prefix_padding_ms: int | None = Field(None, ge=0, le=10000)
    silence_duration_ms: int | None = Field(None, ge=0, le=10000)
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    idle_timeout_ms: int | None = None


class AudioInputIn(_Wire):
    format: AudioFormat | None = None
    turn_detection: TurnDetectionIn | None = None
    transcription: dict[str, Any] | None = None


class AudioOutputIn(_Wire):
    format: AudioFormat | None = None
    voice: str | dict[str, Any] | None = None
    speed: float | None = Field(None, ge=0.25, le=4.0)


class AudioIn(_Wire):
    input: AudioInputIn | None = None
    output: AudioOutputIn | None = None


class SessionIn(_Wire):
    """A `session.update`'s session; the beta fields (`modalities`, `voice`, `turn_detection`,
    `input_audio_transcription`) are accepted too."""

    type: Literal["realtime"] = "realtime"
    instructions: str | None = Field(None, max_length=20000)
    output_modalities: list[Literal["audio", "text"]] | None = Field(None, min_length=1, max_length=1)
    audio: AudioIn | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    modalities: list[Literal["audio", "text"]] | None = None  # beta
    voice: str | None = None  # beta
    turn_detection: TurnDetectionIn | None = None  # beta
    input_audio_transcription: dict[str, Any] | None = None  # beta
    input_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None  # beta
    output_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None  # beta


@dataclass(frozen=True)
class TurnDetection:
    type: str  # server_vad | semantic_vad
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str = "auto"


@dataclass(frozen=True)
class RealtimeConfig:
    """The effective configuration of one Realtime session."""

    voice: str  # the OpenAI voice name the client asked for (or the default)
    instructions: str  # "" = the persona's system prompt
    modality: str = "audio"  # audio | text
    turn_detection: TurnDetection | None = TurnDetection("semantic_vad")
    transcription: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    speed: float = 1.0
    input_format: str = "audio/pcm"  # audio/pcm | audio/pcmu | audio/pcma
    output_format: str = "audio/pcm"
    tools: tuple[ToolSpec, ...] = ()  # the client's (web.realtime.tools)
    tool_choice: str = "auto"  # auto | none | required | a tool's name

    def updated(self, s: SessionIn) -> "RealtimeConfig":
        """This configuration with a `session.update` applied (fields it does not name are kept)."""
        changes: dict[str, Any] = {}
        if s.tools is not None:
            changes["tools"] = tool_specs(s.tools)
        if s.tool_choice is not None:
            changes["tool_choice"] = choice_name(s.tool_choice, changes.get("tools", self.tools))
        elif "tools" in changes and self.tool_choice not in ("auto", "none", "required"):
            changes["tool_choice"] = choice_name({"type": "function", "name": self.tool_choice}, changes["tools"])
        if s.instructions is not None:
            changes["instructions"] = s.instructions
        modalities = s.output_modalities or s.modalities
        if modalities:
            changes["modality"] = modalities[-1] if len(modalities) == 1 else "audio"
        if s.max_output_tokens is not None:
            changes["max_output_tokens"] = None if s.max_output_tokens == "inf" else s.max_output_tokens
        audio_in = s.audio.input if s.audio and s.audio.input else None
        audio_out = s.audio.output if s.audio and s.audio.output else None
        voice = (audio_out.voice if audio_out else None) or s.voice
        if voice is not None:
            changes["voice"] = voice if isinstance(voice, str) else str(voice.get("id", ""))
        if audio_out is not None and audio_out.speed is not None:
            changes["speed"] = audio_out.speed
        for key, part, beta in (("input_format", audio_in, s.input_audio_format),
                                ("output_format", audio_out, s.output_audio_format)):  # fmt: skip
            if part is not None and part.format is not None:
                changes[key] = part.format.type
            elif beta is not None:
                changes[key] = BETA_FORMATS[beta]
        td_set = audio_in is not None and "turn_detection" in audio_in.model_fields_set
        td = audio_in.turn_detection if td_set and audio_in is not None else s.turn_detection
        if td_set or "turn_detection" in s.model_fields_set:
            changes["turn_detection"] = None if td is None else _detection(td)
        transcription = audio_in.transcription if audio_in is not None and "transcription" in audio_in.model_fields_set \
            else s.input_audio_transcription  # fmt: skip
        if transcription is not None or (audio_in is not None and "transcription" in audio_in.model_fields_set):
            changes["transcription"] = transcription
        return replace(self, **changes)

    def turn_policy(self, base: TurnPolicy) -> TurnPolicy:
        """The server's turn policy, as this session's turn detection changes it (manual commits: unchanged)."""
        td = self.turn_detection
        if td is None:
            return base
        # interrupt_response false: speech under a response never stops it (no words rule, an endless minimum)
        barge = {} if td.interrupt_response else {"interrupt_by": "duration", "barge_in_min_speech_ms": NEVER_MS}
        if td.type == "server_vad":
            return replace(base, detection="fixed", hangover_ms=float(td.silence_duration_ms), rejoin_window_ms=0.0, **barge)
        hangover = EAGERNESS_HANGOVER_MS.get(td.eagerness, base.max_hangover_ms)
        detection = base.detection if base.detection != "fixed" else "combined"
        return replace(base, detection=detection, max_hangover_ms=max(float(hangover), base.turn_check_ms), **barge)

    def vad_threshold(self, base: float) -> float:
        td = self.turn_detection
        return td.threshold if td is not None and td.type == "server_vad" else base

    def to_wire(self, session_id: str, model: str) -> dict[str, Any]:
        td = self.turn_detection
        turn: dict[str, Any] | None = None
        if td is not None and td.type == "server_vad":
            turn = {"type": "server_vad", "threshold": td.threshold, "prefix_padding_ms": td.prefix_padding_ms,
                    "silence_duration_ms": td.silence_duration_ms, "create_response": td.create_response,
                    "interrupt_response": td.interrupt_response, "idle_timeout_ms": None}  # fmt: skip
        elif td is not None:
            turn = {"type": "semantic_vad", "eagerness": td.eagerness, "create_response": td.create_response,
                    "interrupt_response": td.interrupt_response}  # fmt: skip
        return {
            "type": "realtime", "object": "realtime.session", "id": session_id, "model": model,
            "output_modalities": [self.modality], "instructions": self.instructions,
            "audio": {"input": {"format": _format(self.input_format), "transcription": self.transcription, "noise_reduction": None,
                                "turn_detection": turn},
                      "output": {"format": _format(self.output_format), "voice": self.voice, "speed": self.speed}},
            "tools": [{"type": "function", **{k: v for k, v in t.openai()["function"].items()}} for t in self.tools],
            "tool_choice": wire_choice(self.tool_choice), "tracing": None, "prompt": None, "truncation": "auto",
            "max_output_tokens": "inf" if self.max_output_tokens is None else self.max_output_tokens,
        }  # fmt: skip


def _format(kind: str) -> dict[str, Any]:
    return {"type": kind, "rate": RATE} if kind == "audio/pcm" else {"type": kind}


def _detection(td: TurnDetectionIn) -> TurnDetection:
    d = TurnDetection(td.type)
    return replace(
        d, threshold=td.threshold if td.threshold is not None else d.threshold,
        prefix_padding_ms=td.prefix_padding_ms if td.prefix_padding_ms is not None else d.prefix_padding_ms,
        silence_duration_ms=td.silence_duration_ms if td.silence_duration_ms is not None else d.silence_duration_ms,
        create_response=td.create_response, interrupt_response=td.interrupt_response, eagerness=td.eagerness or "auto",
    )  # fmt: skip
