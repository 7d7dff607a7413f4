"""What a voice Session says (the /ws messages its outbox holds) as Realtime server events. Pure and stateful:
it hands out item and response ids and keeps each response's lifecycle in the order OpenAI's clients expect
(created, item added, content part added, deltas, the dones, response.done). Knows no sockets."""
from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class _Response:
    id: str
    item_id: str
    modality: str
    text: str = ""
    done: bool = False
    message: int | None = None  # the output index of its message item, once added
    calls: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (output index, function_call item)
    outputs: int = 0  # output items so far


@dataclass
class _UserItem:
    id: str
    start_ms: float = 0.0
    end_ms: float = 0.0
    partial: str = ""


@dataclass
class Translator:
    modality: str = "audio"  # the session's output modality when a response starts
    last_item: str | None = None  # the conversation's newest item (previous_item_id of the next)
    cancelled: set[int] = field(default_factory=set)  # turns whose response the client cancelled
    open_calls: set[str] = field(default_factory=set)  # call ids of function calls the client has not answered yet
    _users: dict[int, _UserItem] = field(default_factory=dict)
    _responses: dict[int, _Response] = field(default_factory=dict)
    _assistant: dict[str, int] = field(default_factory=dict)  # assistant item id -> its turn (for truncate)

    # -- the user's side -------------------------------------------------------------------------------

    def user_item(self, item_id: str, *, text: str | None = None, transcript: str | None = None,
                  status: str = "completed") -> dict[str, Any]:  # fmt: skip
        content = {"type": "input_text", "text": text} if text is not None else {"type": "input_audio", "transcript": transcript}
        return {"id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": status,
                "content": [content]}  # fmt: skip

    def added(self, item: dict[str, Any]) -> list[Event]:
        """A new item in the conversation: `conversation.item.added` (and it becomes the newest)."""
        previous, self.last_item = self.last_item, item["id"]
        return [{"type": "conversation.item.added", "previous_item_id": previous, "item": item}]

    def committed(self, item_id: str) -> list[Event]:
        previous = self.last_item
        return [{"type": "input_audio_buffer.committed", "previous_item_id": previous, "item_id": item_id},
                *self.added(self.user_item(item_id, transcript=None))]  # fmt: skip

    def transcribed(self, item_id: str, transcript: str, seconds: float) -> list[Event]:
        return [
            {"type": "conversation.item.input_audio_transcription.completed", "item_id": item_id, "content_index": 0,
             "transcript": transcript, "usage": {"type": "duration", "seconds": round(seconds, 3)}},
            {"type": "conversation.item.done", "previous_item_id": None,
             "item": self.user_item(item_id, transcript=transcript)},
        ]  # fmt: skip

    # -- what the session says -------------------------------------------------------------------------

    def from_session(self, body: dict[str, Any]) -> list[Event]:
        kind = body["type"]
        turn = body.get("turn_id")
        if kind == "vad.speech_started":
            user = self._users[turn] = _UserItem(new_id("item"), start_ms=body["t_ms"])
            return [{"type": "input_audio_buffer.speech_started", "audio_start_ms": int(body["t_ms"]), "item_id": user.id}]
        if kind == "vad.speech_ended":
            user = self._users.get(turn) or _UserItem(new_id("item"))
            user.end_ms = body["t_ms"]
            out = [{"type": "input_audio_buffer.speech_stopped", "audio_end_ms": int(body["t_ms"]), "item_id": user.id}]
            if body.get("dropped"):  # a cough or "uh-huh": no turn, nothing committed
                self._users.pop(turn, None)
                return out
            return out + self.committed(user.id)
        if kind == "transcript.partial" and turn in self._users:
            user = self._users[turn]
            text = body["text"]
            delta = text[len(user.partial):] if text.startswith(user.partial) else text
            user.partial = text
            return [{"type": "conversation.item.input_audio_transcription.delta", "item_id": user.id,
                     "content_index": 0, "delta": delta}] if delta else []  # fmt: skip
        if kind == "transcript.final" and turn in self._users:
            user = self._users.pop(turn)
            return self.transcribed(user.id, body["text"], max(0.0, user.end_ms - user.start_ms) / 1000.0)
        if kind == "response.text.delta":
            r, out = self._started(turn)
            r.text += body["text"]
            delta_type = "response.output_audio_transcript.delta" if r.modality == "audio" else "response.output_text.delta"
            return out + [{"type": delta_type, **self._where(r), "delta": body["text"]}]
        if kind == "response.done":
            return self._done(turn, body)
        if kind.startswith("tool.call."):
            return self._call(turn, kind, body)
        if kind == "response.resumed":  # speech over the response was no interruption: it goes on (docs/realtime.md)
            return [{"type": "parley.response.resumed", "reason": body["reason"]}]
        if kind == "turn.trace":
            return [{"type": "parley.turn.trace", "trace": {k: v for k, v in body.items() if k != "type"}}]
        if kind == "error":
            server = body["code"] in ("stage_failed", "reply_failed")
            return [error_event("server_error" if server else "invalid_request_error", body["code"], body["message"])]
        return []  # response.audio.clear: the response.done that follows says it was cut short

    def audio(self, turn_id: int, pcm16: bytes) -> list[Event]:
        r, out = self._started(turn_id)
        if r.modality != "audio":
            return out
        return out + [{"type": "response.output_audio.delta", **self._where(r), "delta": base64.b64encode(pcm16).decode()}]

    # -- a response's lifecycle ------------------------------------------------------------------------

    def _where(self, r: _Response) -> dict[str, Any]:
        return {"response_id": r.id, "item_id": r.item_id, "output_index": r.message or 0, "content_index": 0}

    def _call(self, turn: int, kind: str, body: dict[str, Any]) -> list[Event]:
        """A function call of the client's tools, as the model writes it: its item, its arguments' deltas, done."""
        r, out = self._begin(turn)
        if kind == "tool.call.started":
            item = {"id": new_id("item"), "object": "realtime.item", "type": "function_call", "status": "in_progress",
                    "name": body["name"], "call_id": body["call_id"], "arguments": ""}  # fmt: skip
            r.calls.append((r.outputs, item))
            r.outputs += 1
            return out + [{"type": "response.output_item.added", "response_id": r.id, "output_index": r.calls[-1][0], "item": item},
                          *self.added(item)]  # fmt: skip
        if not r.calls:
            return out
        index, item = r.calls[-1]
        where = {"response_id": r.id, "item_id": item["id"], "output_index": index, "call_id": item["call_id"]}
        if kind == "tool.call.delta":
            item["arguments"] += body["arguments"]
            return out + [{"type": "response.function_call_arguments.delta", **where, "delta": body["arguments"]}]
        item.update(status="completed", arguments=body["arguments"])
        self.open_calls.add(item["call_id"])
        if len(self.open_calls) > 256:  # an unanswered call is forgotten after many more
            self.open_calls.discard(next(iter(self.open_calls)))
        return out + [
            {"type": "response.function_call_arguments.done", **where, "name": item["name"], "arguments": item["arguments"]},
            {"type": "response.output_item.done", "response_id": r.id, "output_index": index, "item": item},
            {"type": "conversation.item.done", "previous_item_id": None, "item": item},
        ]

    def _item(self, r: _Response, status: str) -> dict[str, Any]:
        part = {"type": "output_audio", "transcript": r.text} if r.modality == "audio" else {"type": "output_text", "text": r.text}
        return {"id": r.item_id, "object": "realtime.item", "type": "message", "role": "assistant", "status": status,
                "content": [part] if status != "in_progress" else []}  # fmt: skip

    def _response(self, r: _Response, status: str, reason: str | None = None, usage: dict[str, int] | None = None) -> dict[str, Any]:
        details = {"type": status, "reason": reason} if reason else None
        items = [(r.message, self._item(r, "completed" if status == "completed" else "incomplete"))] if r.message is not None else []
        output = [item for _, item in sorted([*items, *r.calls], key=lambda pair: pair[0])] if status != "in_progress" else []
        return {"id": r.id, "object": "realtime.response", "status": status, "status_details": details,
                "output": output, "output_modalities": [r.modality], "usage": _usage(usage)}  # fmt: skip

    def _begin(self, turn: int) -> tuple[_Response, list[Event]]:
        """The turn's response, `response.created` when it is new."""
        r = self._responses.get(turn)
        if r is not None:
            return r, []
        r = self._responses[turn] = _Response(new_id("resp"), new_id("item"), self.modality)
        return r, [{"type": "response.created", "response": self._response(r, "in_progress")}]

    def _started(self, turn: int) -> tuple[_Response, list[Event]]:
        """The turn's response with its message item (added at its first text or audio)."""
        r, out = self._begin(turn)
        if r.message is not None:
            return r, out
        r.message, r.outputs = r.outputs, r.outputs + 1
        self._assistant[r.item_id] = turn
        if len(self._assistant) > 256:  # only recent items can be truncated; the map stays bounded
            del self._assistant[next(iter(self._assistant))]
        part = {"type": "audio", "transcript": ""} if r.modality == "audio" else {"type": "text", "text": ""}
        item = self._item(r, "in_progress")
        return r, out + [
            {"type": "response.output_item.added", "response_id": r.id, "output_index": r.message, "item": item},
            *self.added(item),
            {"type": "response.content_part.added", **self._where(r), "part": part},
        ]

    def _done(self, turn: int, body: dict[str, Any]) -> list[Event]:
        r = self._responses.get(turn)
        if r is not None and r.calls and r.message is None:  # a response that only called functions
            self._responses.pop(turn, None)
            status = "cancelled" if body.get("interrupted") else "completed"
            return [{"type": "response.done", "response": self._response(r, status, None, body.get("usage"))}]
        r, out = self._started(turn)
        self._responses.pop(turn, None)
        interrupted = bool(body.get("interrupted"))
        if interrupted:  # what was heard stays (docs/realtime.md); the client may truncate it further
            r.text = body.get("spoken_text") or ""
        where = self._where(r)
        if r.modality == "audio":
            out += [{"type": "response.output_audio.done", **where},
                    {"type": "response.output_audio_transcript.done", **where, "transcript": r.text}]  # fmt: skip
            part = {"type": "audio", "transcript": r.text}
        else:
            out.append({"type": "response.output_text.done", **where, "text": r.text})
            part = {"type": "text", "text": r.text}
        status = "cancelled" if interrupted else "completed"
        reason = ("client_cancelled" if turn in self.cancelled else "turn_detected") if interrupted else None
        self.cancelled.discard(turn)
        item = self._item(r, "incomplete" if interrupted else "completed")
        return out + [
            {"type": "response.content_part.done", **where, "part": part},
            {"type": "response.output_item.done", "response_id": r.id, "output_index": r.message, "item": item},
            {"type": "conversation.item.done", "previous_item_id": None, "item": item},
            {"type": "response.done", "response": self._response(r, status, reason, body.get("usage"))},
        ]

    def turn_of(self, item_id: str) -> int | None:
        """The turn of an assistant item (a response's output)."""
        return self._assistant.get(item_id)


def error_event(type_: str, code: str, message: str, *, param: str | None = None, event_id: str | None = None) -> Event:
    return {"type": "error", "error": {"type": type_, "code": code, "message": message, "param": param,
                                       "event_id": event_id}}  # fmt: skip


def _usage(counts: dict[str, int] | None) -> dict[str, Any] | None:
    """The engine's token counts in OpenAI's shape: input includes the cached (reused) tokens; text only, since
    audio is recognised and synthesised outside the model. None when the reply ended before the engine finished."""
    if counts is None:
        return None
    i, o = counts["input_tokens"], counts["output_tokens"]
    return {"total_tokens": i + o, "input_tokens": i, "output_tokens": o,
            "input_token_details": {"text_tokens": i, "audio_tokens": 0, "cached_tokens": counts["cached_tokens"]},
            "output_token_details": {"text_tokens": o, "audio_tokens": 0}}  # fmt: skip
