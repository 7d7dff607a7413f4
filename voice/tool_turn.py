"""A voice reply that may call the persona's tools: the engine decodes under the call grammar, a call it makes is
run (a filler phrase is said while it takes longer than FILLER_AFTER_S), and its result goes back for the spoken
answer. A barge-in cancels the running tool unless it is marked not cancellable; a raise or a timeout is a result.

voice.replies speaks what tool_reply yields, as it speaks a plain reply's text; the trace gets the `tool` stage.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from llm_engine import constrain
from llm_engine.request import ChatMessage
from llm_engine.tool_calls import CallParser, CallStarted, Delta, TextDelta, call_constraint
from llm_engine.tool_format import ToolCall, ToolSpec, our_tools_prompt
from voice.llm_bridge import ToolAsk
from voice.timers import Timers, bound
from voice.tool_registry import ToolBox, ToolResult
from voice.trace import TurnTrace

log = logging.getLogger(__name__)

FILLER_AFTER_S = 0.3  # a tool still running this long after it began: the persona's filler is said
CALL_TOKENS = 128  # a request forced to call (required, a name) has this many more tokens: the call is not said
ROUNDS = 2  # engine requests a turn: one that may call a tool, one that answers with its result
_LEFT_RUNNING: set[asyncio.Task[Any]] = set()  # not-cancellable calls a barge-in left to finish (bounded by timeouts)

# one engine request: (messages, constraint, tools, first round?) -> the reply's text deltas (voice.replies). The
# constraint binds our engine's calls; the tools are for an LLM that takes them natively (voice.remote.llm)
Generate = Callable[[list[ChatMessage], "constrain.Constraint | None", ToolAsk, bool], AsyncIterator[str]]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


async def tool_reply(
    generate: Generate,
    messages: Sequence[tuple[str, str]],
    box: ToolBox,
    specs: Sequence[ToolSpec],
    choice: str,
    filler: str,
    timers: Timers,
    trace: TurnTrace | None,
    on_client: Callable[[Delta], None] = lambda d: None,
) -> AsyncIterator[str]:
    """The reply's text: what the model says, the filler while a tool runs, then its answer from the result.

    `specs`: the tools it may call (session_tools); those not in `box` the client runs (the Realtime API's
    session.tools): a call of one goes to `on_client` as it is written (CallStarted, ArgumentsDelta..., CallDone)
    and ends the reply; the client answers it later."""
    history = [m if isinstance(m, ChatMessage) else ChatMessage(*m) for m in messages]
    theirs = {t.name for t in specs} - set(box.tools)
    constraint = call_constraint(specs, choice, parallel=False)
    ask = ToolAsk(tuple(specs), choice, parallel=False)
    results: list[ToolResult] = []  # the calls the last round ran
    for round_no in range(ROUNDS):
        parser = CallParser(new_call_id)
        said: list[str] = []
        forward: set[int] = set()  # the indices of client calls
        async for text in generate(history, constraint, ask, round_no == 0):
            for d in parser.feed(text):
                if isinstance(d, TextDelta):  # a call's own text is never spoken
                    said.append(d.text)
                    yield d.text
                elif round_no == 0 and (d.index in forward or (isinstance(d, CallStarted) and d.name in theirs)):
                    forward.add(d.index)
                    on_client(d)
        for d in parser.close():
            if isinstance(d, TextDelta):
                said.append(d.text)
                yield d.text
        spoken = " ".join(r.content for r in results if r.ok)
        if round_no > 0 and spoken and not "".join(said).strip():  # no answer in words (Qwen2.5-Coder-0.5B calls
            yield spoken  # again instead): the results themselves are said, not silence
        if not parser.calls or forward or round_no == ROUNDS - 1:  # the last round's calls (free text) are dropped
            return
        results = []
        for call in parser.calls:
            task, tool = _start(box, call, timers, trace)
            try:
                done, _ = await asyncio.wait([task], timeout=FILLER_AFTER_S)
                if not done:
                    yield filler + " "  # the space lets the chunker end the filler's phrase now
                    await asyncio.wait([task])
            except BaseException:  # a barge-in (or the session closing) cancelled the reply
                _abandon(task, call, tool is None or tool.cancellable, trace)
                raise
            results.append(_finished(task.result(), trace))
        history += [ChatMessage("assistant", "".join(said).strip(), tuple(parser.calls)),
                    *(ChatMessage("tool", said_by(r), tool_call_id=r.call.id) for r in results)]  # fmt: skip
        constraint = None  # the answer is free text (a native server gets the same tools, so the same prompt, under auto)
        ask = ToolAsk(tuple(specs), "auto", parallel=False)


def said_by(result: ToolResult) -> str:
    """A result as the answering request reads it: naming its tool makes a small model use it (the embedded 135M
    answered "what time is it?" from `The current_time tool says: ...`, and ignored the bare time after a greeting)."""
    return f"The {result.call.name} tool says: {result.content}"


def _start(box: ToolBox, call: ToolCall, timers: Timers, trace: TurnTrace | None) -> tuple[asyncio.Task[ToolResult], Any]:
    if trace is not None:
        trace.mark("tool_start")
    return asyncio.create_task(bound(timers, lambda: box.run(call))()), box.tools.get(call.name)


def _abandon(task: asyncio.Task[ToolResult], call: ToolCall, cancellable: bool, trace: TurnTrace | None) -> None:
    """The reply was cancelled while the call ran: the call is cancelled too, or (a tool marked not cancellable)
    left to finish; its result is dropped."""
    if task.done():
        return
    if cancellable:
        task.cancel()
    else:
        _LEFT_RUNNING.add(task)
        task.add_done_callback(_LEFT_RUNNING.discard)
    if trace is not None:
        trace.info.setdefault("tools", []).append({"name": call.name, "ok": False, "cancelled": cancellable})


def _finished(result: ToolResult, trace: TurnTrace | None) -> ToolResult:
    if trace is not None:
        trace.mark("tool_done")
        entry: dict[str, Any] = {"name": result.call.name, "ms": round(result.ms, 3), "ok": result.ok}
        if not result.ok:
            entry["error"] = result.content
        trace.info.setdefault("tools", []).append(entry)
    if not result.ok:
        log.info("tool %s failed: %s", result.call.name, result.content)
    return result


def with_tools(
    system_prompt: str, persona: Any, client: Sequence[ToolSpec] = (), client_choice: str | None = None, native: bool = False,
    wording: Callable[[str, Sequence[ToolSpec]], str | None] = lambda system, tools: None,
) -> str:
    """The system prompt with the persona's tools and the client's: every request of the session (the warm-up, the
    prefill ahead of the endpoint, the reply) shares it. `wording`: the LLM's own (its chat template's tool section,
    as it was trained: LlmBridge.system_with_tools), else our prompt format (llm_engine.tool_format). native: the
    LLM takes the tools as a request field (a remote server renders them itself): the prompt stays as it is."""
    specs = () if native else session_tools(persona, client, client_choice)
    if not specs:
        return system_prompt
    return wording(system_prompt, specs) or f"{system_prompt}\n\n{our_tools_prompt(specs)}"


def session_tools(persona: Any, client: Sequence[ToolSpec] = (), client_choice: str | None = None) -> tuple[ToolSpec, ...]:
    """The tools a session's replies may call now: the persona's (unless its tool_choice is none) and the client's
    (unless the client's tool_choice is none); a client tool of a persona tool's name is the persona's."""
    mine = persona.toolbox.specs() if persona.tool_choice != "none" else ()
    names = {t.spec.name for t in persona.tools}
    theirs = tuple(t for t in client if t.name not in names) if client_choice != "none" else ()
    return (*mine, *theirs)


def reply_choice(persona: Any, client: Sequence[ToolSpec] = (), client_choice: str | None = None) -> str:
    """The tool_choice a reply decodes under: the client's, when it gave tools and a choice; else the persona's."""
    return client_choice if client and client_choice else persona.tool_choice


def ahead_unfit(persona: Any, client: Sequence[ToolSpec] = (), client_choice: str | None = None, native: bool = False) -> str | None:
    """Why, for its tools, a reply's first phrase may not be made ahead of the endpoint (voice.first_phrase), or None.
    A forced call (required, a name) decodes under the call grammar from its first token, which a free-text phrase
    made ahead cannot begin: it would be thrown away. A remote LLM that takes tools natively gets them only in the
    reply's own request."""
    if not session_tools(persona, client, client_choice):
        return None
    choice = reply_choice(persona, client, client_choice)
    if choice != "auto":
        return f"the reply must call a tool (tool_choice {choice})"
    return "the remote LLM takes the tools in the reply's own request" if native else None

