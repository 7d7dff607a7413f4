"""Tools in a voice session, on fakes (a scripted engine writes the call; the tools are real Python functions): the
call runs and its result goes back for the answer, a filler is said while a slow tool runs, a barge-in cancels the
tool (not one marked not cancellable), a raising tool becomes an error result, and a timer set by text speaks when
it is due while the user says nothing."""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import pytest

from fakes import PERSONAS, FakeEngine, FakeTts, Harness, quiet, tone
from llm_engine.tool_format import call_text, ToolCall
from support.waiting import wait_for
from voice.builtin_tools import current_time
from voice.stages import PersonaSpec
from voice.timers import set_timer
from voice.tool_registry import tool_from

pytestmark = pytest.mark.timeout(60)


@dataclass
class ScriptedEngine(FakeEngine):
    """Each reply request takes the next script's words (one token each); prefills and later requests the last."""

    script: list[list[str]] = field(default_factory=list)

    def submit(self, req, on_event=None):  # type: ignore[no-untyped-def]
        if req.sampling.max_new_tokens and self.script:
            self.reply_words = self.script.pop(0)
        return super().submit(req, on_event)


def call(name: str, **args: object) -> list[str]:
    """The call as the grammar writes it, one token."""
    return [call_text(ToolCall("x", name, json.dumps(args)))]


class Slow:
    """An async tool that runs until released (or cancelled), recording what happened to it."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False
        self.finished = False

    async def run(self) -> str:
        """Runs until released."""
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True
        return "slow result"


def persona(*tools, choice: str = "auto") -> dict[str, PersonaSpec]:  # type: ignore[no-untyped-def]
    base = PERSONAS["assistant"]
    spec = PersonaSpec(base.name, base.system_prompt, base.voice, max_reply_tokens=50, tools=tuple(tools),
                       tool_choice=choice, tool_filler="Let me check.")  # fmt: skip
    return {**PERSONAS, "assistant": spec}


def boom() -> str:
    """Always fails."""
    raise ConnectionError("the weather service is down")


async def test_a_call_runs_and_its_result_comes_back_for_the_spoken_answer(caplog) -> None:
    engine = ScriptedEngine(script=[call("current_time"), "It is late.".split()])
    with caplog.at_level(logging.INFO, logger="voice.session"):
        async with Harness(engine=engine, personas=persona(tool_from(current_time))) as h:
            h.session.text_input("what time is it")
            done = await h.wait_for("response.done")
            trace = await h.wait_for("turn.trace")
    offers = [r.getMessage() for r in caplog.records if "offers tools" in r.getMessage()]
    assert offers == [f"session {h.session.session_id}: persona assistant offers tools: current_time (as given)"]  # once
    assert trace["tools_offered"] == ["current_time"]
    assert done["text"] == "It is late." and not done["interrupted"]  # the call itself is never spoken
    assert len(engine.requests) == 2
    first, second = engine.requests
    assert first.constraint is not None and second.constraint is None
    assert "current_time" in first.messages[0].content  # the tools are in the system prompt
    assistant, result = second.messages[-2:]
    assert assistant.role == "assistant" and assistant.tool_calls[0].name == "current_time"
    assert result.role == "tool" and result.tool_call_id == assistant.tool_calls[0].id
    assert result.content.startswith("The current_time tool says: " + current_time()[:10])  # the time as the tool said it
    assert trace["tools"] == [{"name": "current_time", "ms": trace["tools"][0]["ms"], "ok": True}]
    assert "tool" in trace["stages_ms"] and trace["stages_ms"]["tool"] >= 0
    assert h.session.history[-1] == ("assistant", "It is late.")


def seven() -> str:
    """The number seven."""
    return "Seven."


async def test_an_answer_that_calls_again_instead_of_speaking_says_the_result() -> None:
    """The answering round is free text; a model that writes another call there (Qwen2.5-Coder-0.5B does, bare) says
    nothing of it, so the reply speaks the tool's result rather than leaving the user in silence."""
    again = ['{"name": "seven", "arguments": {}}']
    engine = ScriptedEngine(script=[call("seven"), again])
    async with Harness(engine=engine, personas=persona(tool_from(seven))) as h:
        h.session.text_input("what number comes after six")
        done = await h.wait_for("response.done")
    assert done["text"] == "Seven." and len(engine.requests) == 2


async def test_a_raising_tool_is_answered_with_an_error_result_and_the_conversation_goes_on() -> None:
    engine = ScriptedEngine(script=[call("boom"), "Sorry, that failed.".split(), "Hello again.".split()])
    async with Harness(engine=engine, personas=persona(tool_from(boom))) as h:
        h.session.text_input("what is the weather")
        done = await h.wait_for("response.done")
        trace = await h.wait_for("turn.trace")
        result = engine.requests[1].messages[-1]
        assert result.role == "tool" and result.content == "The boom tool says: error: ConnectionError: the weather service is down"
        assert done["text"] == "Sorry, that failed." and not h.of("error")
        assert trace["tools"][0]["ok"] is False and "ConnectionError" in trace["tools"][0]["error"]
        h.session.text_input("hello")  # the session goes on
        assert (await h.wait_for("response.done", 2))["text"] == "Hello again."


async def test_a_slow_tool_gets_the_filler_and_a_barge_in_cancels_it() -> None:
    slow = Slow()
    engine = ScriptedEngine(script=[call("slow"), "Done.".split()])
    async with Harness(engine=engine, tts=FakeTts(ms_per_word=150.0), personas=persona(tool_from(slow.run, name="slow"))) as h:
        turn = h.session.text_input("do the slow thing")
        await asyncio.wait_for(slow.started.wait(), 10)
        audio = await h.wait_for("audio", turn_id=turn)  # the filler, said while the tool runs
        assert audio and h.of("response.text.delta", turn)[0]["text"] == "Let me check. "
        assert not slow.cancelled
        await h.feed(tone(800), until=lambda: bool(h.of("response.audio.clear")))  # the user talks over it
        done = await h.wait_for("response.done")
        await wait_for(lambda: slow.cancelled, what="the tool's task to be cancelled")
        trace = (await h.wait_for("turn.trace"))
    assert done["turn_id"] == turn and done["interrupted"] and not slow.finished
    assert len(engine.requests) == 1  # no answer was asked for
    assert trace["tools"] == [{"name": "slow", "ok": False, "cancelled": True}]


async def test_a_barge_in_leaves_a_tool_marked_not_cancellable_to_finish() -> None:
    slow = Slow()
    engine = ScriptedEngine(script=[call("slow"), "Done.".split()])
    tool = tool_from(slow.run, name="slow", cancellable=False)
    async with Harness(engine=engine, personas=persona(tool)) as h:
        h.session.text_input("send the email")
        await asyncio.wait_for(slow.started.wait(), 10)
        await h.wait_for("audio")
        h.session.cancel_reply()
        await h.wait_for("response.done")
        slow.release.set()
        await wait_for(lambda: slow.finished, what="the not cancellable tool to finish")
    assert not slow.cancelled


async def test_a_timer_set_by_text_speaks_when_due_while_the_user_is_silent() -> None:
    engine = ScriptedEngine(script=[call("set_timer", seconds=1, label="tea"), "Timer set.".split()])
    async with Harness(engine=engine, personas=persona(tool_from(set_timer))) as h:
        h.session.text_input("set a timer for one second for the tea")
        first = await h.wait_for("response.done")
        assert first["text"] == "Timer set."
        assert engine.requests[1].messages[-1].content == "The set_timer tool says: timer 1 set for 1 second (tea)"
        assert h.session.replies.timers.pending  # not due yet when the answer ended
        due = await h.wait_for("response.done", 2, timeout_s=10)  # nobody said anything: the timer speaks
        assert due["text"] == "Your tea timer is done." and due["turn_id"] > first["turn_id"]
        assert h.of("audio", due["turn_id"])  # spoken, not only written
        assert h.session.history[-1] == ("assistant", "Your tea timer is done.")
        assert len(engine.requests) == 2 and not h.session.replies.timers.pending


async def test_timers_die_with_the_session_and_a_bad_duration_is_an_error_result() -> None:
    engine = ScriptedEngine(script=[call("set_timer", seconds=3600), "Set.".split(), call("set_timer", seconds=0), "No.".split()])
    async with Harness(engine=engine, personas=persona(tool_from(set_timer))) as h:
        h.session.text_input("an hour timer")
        await h.wait_for("response.done")
        timers = h.session.replies.timers
        assert len(timers.pending) == 1
        h.session.text_input("a zero timer")
        await h.wait_for("response.done", 2)
        assert engine.requests[3].messages[-1].content.startswith("The set_timer tool says: error: ValueError: a timer runs")
        tasks = [t for t in h.session._bg if not t.done()]
    assert not timers.fired and all(t.done() for t in tasks)  # closing the session ended the hour's timer


def test_persona_tools_from_the_config() -> None:
    from parley.config import ConfigError, Persona
    from parley.runtime import persona_tools

    def persona_of(**more: object) -> Persona:
        return Persona(name="p", display_name="P", system_prompt="Hi.", voice="joe", **more)  # type: ignore[arg-type]

    assert persona_tools("p", persona_of())[0] == ()  # tools: auto, before the LLM is known: none (parley.tool_offer)
    tools, why = persona_tools("p", persona_of(tools=("default", {"function": "test_tool_turn:boom", "timeout_s": 2,
                                                                "cancellable": False}), tool_choice="boom"))  # fmt: skip
    assert why == "listed in the persona's tools:"
    assert [t.spec.name for t in tools] == ["current_time", "calculate", "set_timer", "boom"]
    assert tools[-1].timeout_s == 2 and not tools[-1].cancellable and "seconds" in tools[2].spec.parameters
    for bad, says in (({"tools": ("voice.builtin_tools:nothing",)}, "tools\\[0\\]"),
                      ({"tools": ("default", "voice.builtin_tools:calculate")}, "two tools of one name"),
                      ({"tools": ("default",), "tool_choice": "weather"}, "tool_choice")):  # fmt: skip
        with pytest.raises(ConfigError, match=says):
            persona_tools("p", persona_of(**bad))


def test_a_persona_s_tools_key_is_checked_with_a_clear_error(tmp_path) -> None:
    """tools: auto (the default) | a list | []; anything else, or a forced tool_choice under auto, stops the load."""
    from parley.config import DEFAULT_CONFIG, ConfigError, load_config, load_persona

    voices = load_config(DEFAULT_CONFIG).voices
    file = tmp_path / "p.yaml"
    base = "display_name: P\nsystem_prompt: Hi.\nvoice: joe\n"
    for more, tools in (("", "auto"), ("tools: auto\n", "auto"), ("tools: []\n", ()), ("tools: [default]\n", ("default",))):
        file.write_text(base + more)
        assert load_persona(file, voices).tools == tools
    for more, says in (("tools: default\n", r"p.yaml: tools: .*'default' is not a list: tools is auto \(the default\), a list"),
                       ("tools: 3\n", "p.yaml: tools: .*3 is not a list"),
                       ("tools: [default, time]\n", r"tools\[1\]: 'time' is neither default nor module:function"),
                       ("tools: [{function: a:b, timeout: 3}]\n", r"tools\[0\].timeout: unknown key"),
                       ("tool_choice: required\n", "p.yaml: tool_choice: .*'required' forces a call, so it needs the tools listed"),
                       ("tools: auto\ntool_choice: current_time\n", "tool_choice: .*needs the tools listed")):  # fmt: skip
        file.write_text(base + more)
        with pytest.raises(ConfigError, match=says):
            load_persona(file, voices)
    file.write_text(base + "tools: [default]\ntool_choice: required\n")  # forcing a listed tool is fine
    assert load_persona(file, voices).tool_choice == "required"


@pytest.mark.parametrize("choice", ["current_time", "auto"])
async def test_a_forced_call_starts_no_first_phrase_in_the_pause(choice: str) -> None:
    """A persona that forces a call: the reply decodes under the call grammar from its first token, so no free-text
    phrase is made ahead (it would be thrown away); the trace says it was shed. Under auto the phrase is made."""
    from voice.turn_policy import TurnPolicy

    engine = ScriptedEngine(script=[call("current_time"), "It is late.".split()] if choice != "auto" else [])
    async with Harness(engine=engine, personas=persona(tool_from(current_time), choice=choice), preemptive_phrase=True,
                       turns=TurnPolicy(detection="fixed", hangover_ms=1500)) as h:  # fmt: skip
        await h.feed(tone(800))
        await h.feed(quiet(3000), until=lambda: bool(h.of("response.done")))
        trace = await h.wait_for("turn.trace")
    generations = [r for r in engine.requests if r.sampling.max_new_tokens > 0]
    if choice == "auto":
        assert trace["preemptive"] == "hit" and len(generations) == 1
        return
    assert trace["preemptive"] == "shed" and trace["preemptive_waste"]["tokens"] == 0, trace
    assert generations[0].constraint is not None and generations[0].constraint.trigger is None  # the forced call first
    assert trace["tools"][0]["name"] == "current_time"
