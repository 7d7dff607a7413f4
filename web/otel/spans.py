"""A finished turn trace as a tree of span descriptions: the turn, its stages and the LLM call (GenAI conventions).

Pure: no clock, no SDK, no I/O. Times are the trace's own marks (perf-counter ns); the exporter maps them to wall time.
Text (what the user said, what was replied) appears only when `include_text` is set.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from voice.trace import STAGES, TurnTrace

Attrs = dict[str, Any]
# the stages shown as their own spans (the LLM call is built apart; voice_to_voice is the turn's attribute)
SIMPLE_STAGES = {"endpointing": "parley.endpointing", "asr": "parley.asr", "phrase": "parley.phrase",
                 "tts": "parley.tts", "send": "parley.send"}  # fmt: skip


@dataclass(frozen=True)
class SpanEvent:
    name: str
    t_ns: int
    attributes: Attrs = field(default_factory=dict)


@dataclass(frozen=True)
class SpanSpec:
    name: str
    start_ns: int
    end_ns: int
    attributes: Attrs = field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()
    children: tuple["SpanSpec", ...] = ()
    error: str | None = None  # the span's status: None is OK

    def walk(self) -> list["SpanSpec"]:
        """This span and every descendant, parents first."""
        out = [self]
        for c in self.children:
            out += c.walk()
        return out


@dataclass(frozen=True)
class LlmFacts:
    """What the trace does not carry about the model: its name and who serves it."""

    model: str
    provider: str  # gen_ai.provider.name: "parley" for the engine in this process, "openai" for an OpenAI-compatible server


def turn_spans(trace: TurnTrace, llm: LlmFacts, include_text: bool = False) -> SpanSpec | None:
    """The turn span with its stage spans, or None for a trace without marks."""
    marks = trace.marks_ns
    if not marks:
        return None
    info = trace.info
    stages = trace.stages_ms()
    children: list[SpanSpec] = []
    for stage, name in SIMPLE_STAGES.items():
        if stage in stages:
            children.append(_stage_span(trace, stage, name, include_text))
    if "llm_start" in marks:
        children.append(_llm_span(trace, llm, include_text))
    children.sort(key=lambda s: s.start_ns)
    attrs: Attrs = {
        "parley.session_id": trace.session_id,
        "gen_ai.conversation.id": trace.session_id,
        "parley.turn.id": trace.turn_id,
        "parley.turn.outcome": "interrupted" if "interrupted" in marks else "done" if "done" in marks else "unfinished",
    }
    for key in ("input", "persona", "voice"):
        if isinstance(info.get(key), str):
            attrs[f"parley.turn.{key}"] = info[key]
    if isinstance(info.get("turn"), Mapping) and "end" in info["turn"]:
        attrs["parley.turn.end"] = str(info["turn"]["end"])
    for stage, ms in stages.items():
        attrs[f"parley.stage.{stage}_ms"] = ms
    if trace.over_budget():
        attrs["parley.over_budget"] = trace.over_budget()
    attrs.update(_flat("parley.ahead", info.get("ahead")))
    attrs.update(_flat("parley.queue_ms", info.get("queue_ms")))
    attrs.update(_flat("parley.context", info.get("context")))
    events: list[SpanEvent] = []
    if "joins" in info:  # this turn continues an earlier request (rejoin)
        at_ns = marks.get("speech_start", min(marks.values()))
        events.append(SpanEvent("parley.rejoin", at_ns, {"parley.turn.joins": info["joins"]}))
    if "joined_into" in info:
        events.append(SpanEvent("parley.joined_into", max(marks.values()), {"parley.turn.joined_into": info["joined_into"]}))
    if "playback_start" in marks:
        events.append(SpanEvent("parley.playback_start", marks["playback_start"]))
    if "interrupted" in marks:
        events.append(SpanEvent("parley.barge_in", marks["interrupted"]))
    if include_text:
        for key in ("user", "reply"):
            if key in trace.texts:
                attrs[f"parley.text.{key}"] = trace.texts[key]
    error = info.get("error")
    return SpanSpec("parley.turn", min(marks.values()), max(marks.values()), attrs, tuple(sorted(events, key=lambda e: e.t_ns)),
                    tuple(children), str(error) if error else None)  # fmt: skip


def _stage_span(trace: TurnTrace, stage: str, name: str, include_text: bool) -> SpanSpec:
    a, b = STAGES[stage]
    start, end = trace.marks_ns[a], trace.marks_ns[b]
    attrs: Attrs = {"parley.stage": stage, "parley.stage_ms": trace.stages_ms()[stage]}
    events: tuple[SpanEvent, ...] = ()
    if stage == "asr":
        # recognition that ran ahead of the endpoint ends before it: the span is empty, parley.stage_ms negative
        end = max(start, end)
        if include_text and "user" in trace.texts and trace.info.get("input") == "voice":
            attrs["parley.transcript"] = trace.texts["user"]
    elif stage == "endpointing":
        events = tuple(_check_events(trace, start, end))
    return SpanSpec(name, start, end, attrs, events)


def _check_events(trace: TurnTrace, start_ns: int, end_ns: int) -> list[SpanEvent]:
    """Each end-of-turn check at its silence after speech end; a check that saw speech come back is a resume."""
    turn = trace.info.get("turn")
    checks = turn.get("checks", []) if isinstance(turn, Mapping) else []
    out = []
    for c in checks:
        t_ns = min(end_ns, start_ns + int(float(c.get("silence_ms") or 0.0) * 1e6))
        attrs = {f"parley.check.{k}": v for k, v in c.items() if v is not None}
        out.append(SpanEvent("parley.turn_check", t_ns, attrs))
        if c.get("decision") == "stale":
            out.append(SpanEvent("parley.resume", t_ns))
    return out


def _llm_span(trace: TurnTrace, llm: LlmFacts, include_text: bool) -> SpanSpec:
    """The model call as GenAI's "chat {model}" span, with the engine's prefill (to the first token) and decode."""
    marks = trace.marks_ns
    start = marks["llm_start"]
    facts = trace.info.get("llm") if isinstance(trace.info.get("llm"), Mapping) else {}
    if "generate_ms" in facts:
        end = start + int(float(facts["generate_ms"]) * 1e6)
    else:  # the call ended without its counts (failed or cancelled): it lasted at most to the turn's end
        end = max(v for k, v in marks.items() if k in ("done", "interrupted", "llm_first_token", "llm_start"))
    attrs: Attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": llm.provider,
        "gen_ai.system": llm.provider,
        "gen_ai.request.model": llm.model,
        "gen_ai.conversation.id": trace.session_id,
    }
    if facts:
        prefill, reused = int(facts.get("prefill_tokens", 0)), int(facts.get("reused_tokens", 0))
        attrs["gen_ai.usage.input_tokens"] = prefill + reused
        attrs["gen_ai.usage.cache_read.input_tokens"] = reused
        attrs["gen_ai.usage.output_tokens"] = int(facts.get("decode_tokens", 0))
        if "finish" in facts:
            attrs["gen_ai.response.finish_reasons"] = [str(facts["finish"])]
        for key in ("queue_ms", "shared_prefix_tokens"):
            if key in facts:
                attrs[f"parley.llm.{key}"] = facts[key]
    children: list[SpanSpec] = []
    if "llm_first_token" in marks:
        first = marks["llm_first_token"]
        ttft_ms = trace.stages_ms()["llm_ttft"]
        attrs["gen_ai.response.time_to_first_chunk"] = ttft_ms / 1000.0
        attrs["parley.llm.ttft_ms"] = ttft_ms
        children.append(SpanSpec("parley.llm.prefill", start, first, {"parley.stage": "llm_ttft", "parley.stage_ms": ttft_ms}))
        children.append(SpanSpec("parley.llm.decode", first, max(first, end)))
    if include_text:
        if "user" in trace.texts:
            attrs["gen_ai.input.messages"] = _messages("user", trace.texts["user"])
        if "reply" in trace.texts:
            attrs["gen_ai.output.messages"] = _messages("assistant", trace.texts["reply"])
    return SpanSpec(f"chat {llm.model}", start, end, attrs, (), tuple(children))


def _messages(role: str, text: str) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])


def _flat(prefix: str, d: object) -> Attrs:
    """A dict of numbers and strings as prefixed attributes (nested values left out)."""
    if not isinstance(d, Mapping):
        return {}
    return {f"{prefix}.{k}": v for k, v in d.items() if isinstance(v, (int, float, str, bool))}
