"""A conversation's memory: what the user said and what they heard, in order, kept within bounds.

Pure and synchronous (no asyncio, no clock, no models): voice.session records into it as turns and replies end.
Beside the messages it remembers where recent replies sit, so that what the user actually heard can replace what
was written (a barge-in, a playback mark that comes late, the Realtime API's truncate), and where the last voice
exchange began, so that a continuation joining its request replaces that exchange.

The messages change only through its methods, and every change is also told, as a frozen `Change`, to a sink
(voice.conversation's store): an append-only log that `replay` turns back into the same messages.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

Message = tuple[str, str]  # (role, content)
RECENT_REPLIES = 16  # replies whose place in the history is remembered (for truncate)


@dataclass(frozen=True)
class Added:
    role: str
    content: str


@dataclass(frozen=True)
class Replaced:
    index: int
    content: str


@dataclass(frozen=True)
class Removed:
    start: int
    stop: int  # messages[start:stop] went


@dataclass(frozen=True)
class Summarised:
    stop: int  # messages[:stop] went, and a summary of them (and of any summary among them) stands first
    text: str


Change = Added | Replaced | Removed | Summarised
SUMMARY = "summary"  # the role of the summary that stands first once the oldest messages were summarised
SUMMARY_INTRO = "Earlier in this conversation (a summary): "


def replay(changes: Iterable[Change]) -> list[Message]:
    """The messages a log of changes leaves."""
    messages: list[Message] = []
    for c in changes:
        if isinstance(c, Added):
            messages.append((c.role, c.content))
        elif isinstance(c, Replaced):
            messages[c.index] = (messages[c.index][0], c.content)
        elif isinstance(c, Summarised):
            messages[: c.stop] = [(SUMMARY, c.text)]
        else:
            del messages[c.start : c.stop]
    return messages


def transcript(changes: Iterable[Change]) -> list[Message]:
    """Everything a log of changes said, in order: what `replay` leaves, and what trims and joined requests took out
    of the prompt since (a correction applies to the message it corrected). Summaries are no part of it."""
    said: list[Message] = []
    live: list[int] = []  # the messages replay would leave, as indices into `said` (-1: the summary)
    for c in changes:
        if isinstance(c, Added):
            live.append(len(said))
            said.append((c.role, c.content))
        elif isinstance(c, Replaced):
            at = live[c.index]
            said[at] = (said[at][0], c.content)
        elif isinstance(c, Summarised):
            live[: c.stop] = [-1]
        else:
            del live[c.start : c.stop]
    return said


class HeardReply(Protocol):
    """What the history needs of a reply (voice.reply.Reply)."""

    turn_id: int
    text: str
    sent_ms: float
    played_ms: float

    def spoken(self, heard_ms: float | None = None) -> str: ...


class History:
    def __init__(
        self, max_chars: int, max_messages: int, *, messages: Iterable[Message] = (), sink: Callable[[Change], None] | None = None
    ) -> None:
        self.max_chars, self.max_messages = max_chars, max_messages
        self._messages: list[Message] = list(messages)  # a conversation's so far (resumed from its log)
        self._sink = sink or (lambda change: None)
        self._said: dict[int, tuple[HeardReply, int]] = {}  # recent replies: turn -> (reply, index)
        self._interrupted: tuple[HeardReply, int] | None = None  # the reply interrupted last, and its index
        self._exchange: tuple[int, int] | None = None  # (voice turn, number of messages before its user message)

    @property
    def messages(self) -> tuple[Message, ...]:
        return tuple(self._messages)

    def _add(self, role: str, content: str) -> None:
        self._messages.append((role, content))
        self._sink(Added(role, content))

    def _replace(self, index: int, content: str) -> None:
        self._messages[index] = (self._messages[index][0], content)
        self._sink(Replaced(index, content))

    def _remove(self, start: int, stop: int) -> None:
        if stop > start:
            del self._messages[start:stop]
            self._sink(Removed(start, stop))

    def add(self, role: str, content: str) -> None:
        """A message no turn of ours made (a client's item, its tool's output, a call as the model wrote it)."""
        self._add(role, content)

    def pop_last(self) -> Message:
        """The last message, taken out (to be asked again as a turn)."""
        last = self._messages[-1]
        self._remove(len(self._messages) - 1, len(self._messages))
        return last

    def prompt(self, system: str, user_text: str | None = None, joins: int | None = None) -> list[Message]:
        """System, history, the user's text. `joins`: the turn this one continues, whose exchange (its user message
        and what was heard of its reply) the joined request replaces."""
        kept = self._messages
        if joins is not None and self._exchange is not None and self._exchange[0] == joins:
            kept = kept[: self._exchange[1]]
        if kept and kept[0][0] == SUMMARY:  # what the oldest turns said, as part of the system prompt
            system, kept = f"{system}\n\n{SUMMARY_INTRO}{kept[0][1]}", kept[1:]
        return [("system", system), *kept, *([("user", user_text)] if user_text is not None else [])]

    def drop_joined(self, joins: int | None) -> None:
        """A request continued: the exchange of the turn it joins (its user message, the early reply) goes."""
        if joins is not None and self._exchange is not None and self._exchange[0] == joins:
            self._remove(self._exchange[1], len(self._messages))
            self._interrupted = None

    def add_user(self, text: str, voice_turn: int | None = None) -> None:
        """`voice_turn`: the voice turn this message is, so that a continuation can later replace its exchange."""
        if voice_turn is not None:
            self._exchange = (voice_turn, len(self._messages))
        self._add("user", text)

    def add_reply(self, reply: HeardReply, content: str, interrupted: bool) -> None:
        self._add("assistant", content)
        index = len(self._messages) - 1
        self._said[reply.turn_id] = (reply, index)
        if len(self._said) > RECENT_REPLIES:
            del self._said[next(iter(self._said))]
        if interrupted:
            self._interrupted = (reply, index)

    @property
    def interrupted(self) -> HeardReply | None:
        """The reply interrupted last, while a late playback mark can still correct what the history keeps of it."""
        return self._interrupted[0] if self._interrupted is not None else None

    def correct(self, turn_id: int, played_ms: float) -> None:
        """A playback mark that came after its reply was interrupted: the history keeps what was played."""
        if self._interrupted is None or self._interrupted[0].turn_id != turn_id:
            return
        reply, index = self._interrupted
        reply.played_ms = played_ms
        if index < len(self._messages) and self._messages[index][0] == "assistant":
            self._replace(index, reply.spoken())

    def truncate(self, turn_id: int, heard_ms: float, spoken: bool, slack_ms: float) -> str:
        """A recent reply keeps only its words of the first `heard_ms` (all of its text when it was not spoken).
        -> what is kept. ValueError when it is no longer in the history or `heard_ms` is more than was sent."""
        said = self._said.get(turn_id)
        if said is None or said[1] >= len(self._messages) or self._messages[said[1]][0] != "assistant":
            raise ValueError(f"the reply of turn {turn_id} is no longer in the history")
        reply, index = said
        if heard_ms > reply.sent_ms + slack_ms:
            raise ValueError(f"{heard_ms:.0f} ms heard of {reply.sent_ms:.0f} ms sent")
        kept = reply.spoken(heard_ms) if spoken else reply.text.strip()
        self._replace(index, kept)
        return kept

    def trim(self, force: bool = False, slack: float = 1.0) -> int:
        """A conversation that outgrew max_chars or max_messages loses its oldest half at once, from a user turn on:
        the prompt's prefix (and the engine's cache of it) then stays the same for many turns, where dropping one
        message a turn changed it every turn. A summary of older turns stays first. `force`: halve it now, however
        long (the engine had to leave messages out to fit its context: its tokens outgrew the character budget).
        `slack`: outgrown only past this share of the bounds (a summary of the oldest turns is on its way).
        -> how many messages went."""
        if not force and not self._over(slack):
            return 0
        chars = sum(len(text) for _, text in self._messages)
        cut = self.cut_point(min(self.max_chars, chars) // 2)
        start = 1 if self._messages and self._messages[0][0] == SUMMARY else 0
        if cut <= start:
            return 0
        self._remove(start, cut)
        self._moved(start, cut, start)
        return cut - start

    def summary_due(self, ahead: float) -> int:
        """Past `ahead` of its bounds, the oldest messages should be summarised before the bound drops them:
        -> how many (from the first, a summary among them), leaving about 40 % of max_chars from a user turn on; 0:
        not yet (or too little to summarise)."""
        if not self._over(ahead):
            return 0
        cut = self.cut_point(int(0.4 * self.max_chars))
        return cut if cut >= 2 else 0

    def summarise(self, stop: int, text: str) -> None:
        """messages[:stop] give way to their summary (which folds into the system prompt)."""
        self._messages[:stop] = [(SUMMARY, text)]
        self._sink(Summarised(stop, text))
        self._moved(0, stop, 1)

    def prompt_summarised(self, system: str, stop: int, text: str) -> list[Message]:
        """The prompt as it will be once messages[:stop] gave way to their summary `text` (to compute it ahead)."""
        return History(self.max_chars, self.max_messages, messages=[(SUMMARY, text), *self._messages[stop:]]).prompt(system)

    def cut_point(self, keep_chars: int) -> int:
        """Where a cut begins that keeps about `keep_chars` of the newest messages (and at most half of
        max_messages), moved on to a user message."""
        msgs = self._messages
        cut = len(msgs)
        while cut > 0 and keep_chars - len(msgs[cut - 1][1]) >= 0 and len(msgs) - cut < self.max_messages // 2:
            cut -= 1
            keep_chars -= len(msgs[cut][1])
        while cut < len(msgs) and msgs[cut][0] != "user":
            cut += 1
        return cut

    def _over(self, share: float) -> bool:
        chars = sum(len(text) for _, text in self._messages)
        return chars > share * self.max_chars or len(self._messages) > share * self.max_messages

    def _moved(self, start: int, stop: int, to: int) -> None:
        """messages[start:stop] became messages[start:to]: the places it remembers move down with them (gone if
        what they held went)."""

        def moved(i: int) -> int | None:
            return i if i < start else None if i < stop else i - stop + to

        if self._exchange is not None:
            at = moved(self._exchange[1])
            self._exchange = None if at is None else (self._exchange[0], at)
        if self._interrupted is not None:
            at = moved(self._interrupted[1])
            self._interrupted = None if at is None else (self._interrupted[0], at)
        self._said = {t: (r, at) for t, (r, i) in self._said.items() if (at := moved(i)) is not None}


def reply_content(reply: HeardReply, interrupted: bool) -> tuple[str, str]:
    """-> (what was spoken of `reply`, what the history keeps of it): an interrupted reply keeps what was heard."""
    spoken = reply.spoken() if interrupted else reply.spoken(math.inf)
    return spoken, spoken if interrupted else reply.text.strip()
