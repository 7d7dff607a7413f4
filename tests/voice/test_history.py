"""The conversation's memory as a pure core: scripted turns and replies in, the messages a prompt gets out."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from voice.history import Added, History, Removed, Replaced, replay, reply_content, transcript


@dataclass
class Said:
    """A reply whose words each took 100 ms of audio."""

    turn_id: int
    text: str
    played_ms: float = 0.0

    @property
    def sent_ms(self) -> float:
        return 100.0 * len(self.text.split())

    def spoken(self, heard_ms: float | None = None) -> str:
        ms = self.played_ms if heard_ms is None else heard_ms
        words = self.text.split()
        return " ".join(words[: len(words) if math.isinf(ms) else int(ms // 100)])


def test_a_continuation_replaces_the_exchange_it_joins() -> None:
    h = History(max_chars=10_000, max_messages=100)
    h.add_user("hello", voice_turn=1)
    h.add_reply(Said(1, "Hi there."), "Hi there.", interrupted=False)
    h.add_user("book a table", voice_turn=2)
    early = Said(2, "Sure, for when?")
    h.add_reply(early, *reply_content(early, interrupted=True)[1:], interrupted=True)
    assert h.prompt("sys", "book a table for four", joins=2) == [
        ("system", "sys"), ("user", "hello"), ("assistant", "Hi there."), ("user", "book a table for four")]
    h.drop_joined(2)
    assert list(h.messages) == [("user", "hello"), ("assistant", "Hi there.")]
    h.drop_joined(1)  # only the last voice exchange can be joined
    assert len(h.messages) == 2


def test_an_interrupted_reply_keeps_what_was_heard_and_a_late_mark_corrects_it() -> None:
    h = History(max_chars=10_000, max_messages=100)
    h.add_user("tell me a story", voice_turn=1)
    reply = Said(1, "Once upon a time there was a fox.", played_ms=200.0)
    spoken, content = reply_content(reply, interrupted=True)
    assert spoken == content == "Once upon"
    h.add_reply(reply, content, interrupted=True)
    h.correct(1, 400.0)  # the client had played more than the interrupt knew
    assert h.messages[-1] == ("assistant", "Once upon a time")
    h.correct(2, 800.0)  # another turn's mark changes nothing
    assert h.messages[-1] == ("assistant", "Once upon a time")


def test_truncate_keeps_the_words_heard_and_refuses_what_it_cannot_know() -> None:
    h = History(max_chars=10_000, max_messages=100)
    h.add_user("hi")
    h.add_reply(Said(1, "Hello, how can I help?"), "Hello, how can I help?", interrupted=False)
    assert h.truncate(1, 200.0, spoken=True, slack_ms=0.0) == "Hello, how"
    assert h.messages[-1] == ("assistant", "Hello, how")
    with pytest.raises(ValueError, match="ms heard of"):
        h.truncate(1, 5000.0, spoken=True, slack_ms=1000.0)
    with pytest.raises(ValueError, match="no longer in the history"):
        h.truncate(7, 100.0, spoken=True, slack_ms=0.0)


def test_trim_drops_the_oldest_half_from_a_user_turn_and_moves_the_indices() -> None:
    h = History(max_chars=60, max_messages=100)
    for turn in range(1, 6):
        h.add_user(f"question {turn}", voice_turn=turn)
        h.add_reply(Said(turn, f"answer number {turn}"), f"answer number {turn}", interrupted=False)
    before = len(h.messages)
    dropped = h.trim()
    assert dropped > 0 and len(h.messages) == before - dropped
    assert h.messages[0][0] == "user" and sum(len(t) for _, t in h.messages) <= 60
    assert h.trim() == 0  # within bounds now: nothing more goes
    assert h.truncate(5, 100.0, spoken=True, slack_ms=0.0) == "answer"  # the last reply is still found
    with pytest.raises(ValueError):
        h.truncate(1, 100.0, spoken=True, slack_ms=0.0)  # the first one went with the cut


def test_trim_by_count() -> None:
    h = History(max_chars=10_000, max_messages=4)
    for turn in range(1, 4):
        h.add_user("q")
        h.add_reply(Said(turn, "a"), "a", interrupted=False)
    assert h.trim() == 4 and list(h.messages) == [("user", "q"), ("assistant", "a")]


def test_a_transcript_keeps_what_trims_and_joins_took_out_of_the_prompt() -> None:
    changes: list = []
    h = History(max_chars=60, max_messages=100, sink=changes.append)
    for turn in range(1, 6):
        h.add_user(f"question {turn}", voice_turn=turn)
        h.add_reply(Said(turn, f"answer number {turn}"), f"answer number {turn}", interrupted=turn == 5)
    h.trim()
    h.correct(5, 100.0)  # the last reply, interrupted after one word: its correction lands on its own message
    h.add_user("and then", voice_turn=6)
    h.drop_joined(6)
    assert replay(changes) == list(h.messages)
    said = transcript(changes)
    assert [t for _, t in said][:2] == ["question 1", "answer number 1"]  # trimmed out of the prompt, still said
    assert ("assistant", "answer") in said and ("assistant", "answer number 5") not in said
    assert said[-1] == ("user", "and then") and len(said) == 11


def test_every_change_of_the_history_is_logged_and_the_log_replays_it() -> None:
    log: list[object] = []
    h = History(max_chars=120, max_messages=100, sink=log.append)
    for turn in range(1, 6):
        h.add_user(f"question number {turn} about something", voice_turn=turn)
        h.add_reply(Said(turn, "one two three four five six"), "one two three four five six", interrupted=turn == 5)
        h.trim()
    h.correct(5, 300.0)  # a late mark: the interrupted reply keeps what played
    h.truncate(5, 200.0, spoken=True, slack_ms=0.0)
    h.add_user("more", voice_turn=6)
    h.drop_joined(6)
    h.add("tool", "{}")
    assert h.pop_last() == ("tool", "{}")
    assert {type(c) for c in log} == {Added, Replaced, Removed}
    assert replay(log) == list(h.messages)  # type: ignore[arg-type]
