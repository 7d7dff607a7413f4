"""A long conversation's oldest turns summarised ahead of time, instead of forgotten when the history reaches its
bound (voice.history.trim): the engine writes the summary in the conversation's own side slot while the session is
idle, held (paused) while a reply runs, started only when no other session's request is in the engine (preemptive
work is shed under load); a summary that is ready is put in place as the next reply ends, and the shorter prompt is
prefilled again right then (Session.rewarm), so no turn's first token waits for the rebuild.

What to summarise and where it goes is voice.history's (summary_due, summarise); this shell only runs the request.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import aclosing, suppress
from dataclasses import dataclass
from typing import Protocol

from voice.history import SUMMARY, History, Message
from voice.llm_bridge import LlmCall, LlmError, LlmFinish, LlmToken

log = logging.getLogger(__name__)
AHEAD = 0.6  # of the history's bounds: a summary is written from here on, before the bound would drop the turns
SLACK = 1.25  # while one is on its way, the bound drops turns only past this share of it (the context has room)
MAX_SUMMARY_TOKENS = 160
# a summary grows by the summary of each newer part, its older sentences kept word for word (every pass of a small
# model over them loses some); past this many characters (or a quarter of the history's) the whole is summarised again
MAX_SUMMARY_CHARS = 1200
SUMMARY_SYSTEM = "You keep short notes of a spoken conversation between a user and an assistant."
SUMMARY_ASK = (
    "Summarise the conversation below in at most five short sentences, in the language it is in. Keep every fact the"
    " user stated about themselves (names, preferences, plans, numbers) and anything still to be done. Write only the"
    " summary.\n\n"
)


class SummaryLlm(Protocol):
    def generate(self, session_id: str, messages: Sequence[tuple[str, str]], *, max_new_tokens: int, background: bool) -> LlmCall: ...

    def release(self, session_id: str) -> None: ...

    def other_requests(self, session_id: str) -> int: ...


@dataclass(frozen=True)
class Summary:
    covers: tuple[Message, ...]  # the messages it summarises, as they stood: it applies while they still stand first
    text: str


def summary_prompt(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """The request that summarises `messages` (a summary among them is folded in as what came earlier)."""
    lines = [f"Earlier: {text}" if role == SUMMARY else f"{role.capitalize()}: {text}" for role, text in messages]
    return [("system", SUMMARY_SYSTEM), ("user", SUMMARY_ASK + "\n".join(lines))]


def whole_sentences(text: str) -> str:
    """A summary cut at the token limit, up to its last whole sentence (all of it if none ended)."""
    ends = [i for i, ch in enumerate(text) if ch in ".!?。！？" and (i + 1 == len(text) or text[i + 1].isspace())]
    return text[: ends[-1] + 1] if ends else text


class Summariser:
    def __init__(
        self, session_id: str, memory: History, llm: SummaryLlm, spawn: Callable[..., asyncio.Task[None] | None],
        system: Callable[[], str], *, on: bool = True,
    ) -> None:  # fmt: skip
        self.system = system  # the session's system prompt now (the prompt to come is computed ahead with it)
        self.on = on  # off: the history's bound drops the oldest turns (voice.history.trim)
        self.key = f"{session_id}/summary"  # a slot of its own: the conversation's cached prompt stays where it is
        self.session_id = session_id
        self.memory, self.llm, self.spawn = memory, llm, spawn
        self.ready: Summary | None = None
        self._call: LlmCall | None = None
        self._task: asyncio.Task[None] | None = None
        self._replying = False  # a reply of the session runs (between reply_started and go_on)

    def reply_started(self) -> None:
        """A reply runs: the summary waits for it (its steps paused; its place and cache kept)."""
        self._replying = True
        if self._call is not None:
            self._call.hold(True)

    def take_ready(self) -> Summary | None:
        """A reply ended: -> the summary written meanwhile, if its messages still stand first (else it is dropped),
        for the caller to put in place (apply)."""
        ready, self.ready = self.ready, None
        if ready is not None and self.memory.messages[: len(ready.covers)] == ready.covers:
            return ready
        return None

    def go_on(self) -> None:
        """A reply ended: the summary's request goes on, or starts if one is due and no other session's request
        is in the engine."""
        self._replying = False
        if self._call is not None:
            self._call.hold(False)
        elif self.on and self._task is None and self.memory.summary_due(AHEAD) and self.llm.other_requests(self.session_id) == 0:
            with suppress(RuntimeError):  # the session is closing (a reply cancelled with it ends here): none starts
                self._task = self.spawn(self._write)

    @property
    def underway(self) -> bool:
        """A summary is being written (or its prompt computed): the history may outgrow its bound a little for it."""
        return self._task is not None

    def apply(self, summary: Summary) -> int:
        """Put it in place: -> how many messages it replaced."""
        self.memory.summarise(len(summary.covers), summary.text)
        return len(summary.covers)

    async def _write(self) -> None:
        covers = self.memory.messages[: self.memory.summary_due(AHEAD)]
        kept = covers[0][1] if covers and covers[0][0] == SUMMARY else ""
        # the last summary stays as it is and only what came after is new, while it is a small part of the history
        if kept and len(kept) < min(MAX_SUMMARY_CHARS, self.memory.max_chars // 4):
            asked, covers_new = summary_prompt(covers[1:]), True
        else:
            asked, covers_new = summary_prompt(covers), False
        text: list[str] = []
        finish = ""
        try:
            self._call = self.llm.generate(self.key, asked, max_new_tokens=MAX_SUMMARY_TOKENS, background=True)
            if self._replying:  # a reply began before this task ran
                self._call.hold(True)
            async with aclosing(self._call) as call:
                async for event in call:
                    if isinstance(event, LlmToken):
                        text.append(event.text)
                    elif isinstance(event, LlmError):
                        log.warning("session %s: the summary failed: %s", self.session_id, event.message)
                        return
                    elif isinstance(event, LlmFinish):
                        finish = event.reason
                        break
            summary = whole_sentences("".join(text).strip()) if finish == "length" else "".join(text).strip()
            if summary and covers_new:
                summary = f"{kept} {summary}"
            if summary and await self._compute(self.memory.prompt_summarised(self.system(), len(covers), summary)):
                self.ready = Summary(tuple(covers), summary)
        finally:
            self._call = self._task = None

    async def _compute(self, prompt: list[tuple[str, str]]) -> bool:
        """The prompt to come into the side slot, ahead: once the summary is in place, the conversation's next
        request copies these keys and values from it (the engine's prefix cache across slots) instead of computing
        a thousand tokens while the user waits. The slot stays filled (an idle slot is the engine's to evict).
        -> whether it finished."""
        self._call = self.llm.generate(self.key, prompt, max_new_tokens=0, background=True)
        if self._replying:
            self._call.hold(True)
        async with aclosing(self._call) as call:
            async for event in call:
                if isinstance(event, LlmError):
                    return False
                if isinstance(event, LlmFinish):
                    return event.reason != "cancelled"
        return False
