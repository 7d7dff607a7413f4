"""The OpenAI-compatible requests Parley accepts (pydantic at the wire) and the error shape it answers with.

Unknown fields are ignored, as OpenAI's own servers and vLLM do (SDKs send more than any server reads); a field
whose value Parley cannot honour (n > 1) is a 400 naming it rather than a silent difference.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field, field_validator

from web.openai_api.tools import ResponseFormat, Tool, ToolChoice, WireToolCall

MAX_STOP = 4  # OpenAI's limit
MAX_TEXT_CHARS = 100_000  # one message, or a speech input (OpenAI allows 4096 characters for speech)


class ApiError(HTTPException):
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:  # fmt: skip
        super().__init__(status, message)
        self.body = {"error": {"message": message, "type": type, "param": param, "code": code}}


STAGE_WORDS = {"asr": "speech recognition", "llm": "chat completions", "tts": "speech synthesis"}


def require_stage(served: Collection[str], stage: str) -> None:
    """A route of a stage this process does not serve (`parley stages --only`): 404 in OpenAI's shape."""
    if stage not in served:
        raise ApiError(404, f"this server does not serve {STAGE_WORDS[stage]} (it serves: {', '.join(sorted(served))}; "
                            "server.stages)", code="stage_not_served")  # fmt: skip


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Wire):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT_CHARS)


class Message(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(default=None)
    tool_calls: list[WireToolCall] | None = Field(default=None, max_length=64)  # an assistant's calls
    tool_call_id: str | None = Field(default=None, max_length=256)  # a tool result: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    @field_validator("content")
    @classmethod
    def _bounded(cls, v: Any) -> Any:
        if isinstance(v, str) and len(v) > MAX_TEXT_CHARS:
            raise ValueError(f"a message is at most {MAX_TEXT_CHARS} characters")
        return v


class StreamOptions(_Wire):
    include_usage: bool = False


class ChatRequest(_Wire):
    model: str = ""
    messages: list[Message] = Field(min_length=1, max_length=1000)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)
    n: int = 1
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP or any(len(s) > 256 for s in stops):
            raise ApiError(400, f"stop: at most {MAX_STOP} strings of at most 256 characters", param="stop")
        return tuple(s for s in stops if s)

    def check_supported(self) -> None:
        if self.n != 1:
            raise ApiError(400, "n: only 1 choice per request is supported", param="n")


class SpeechRequest(_Wire):
    model: str = ""
    input: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    voice: str | dict[str, Any]
    response_format: Literal["pcm", "wav"] = "pcm"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    instructions: str | None = None

    def voice_name(self) -> str:
        return self.voice if isinstance(self.voice, str) else str(self.voice.get("id", ""))
