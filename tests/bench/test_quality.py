"""bench.quality's scorer, its number reader and its question file: right replies pass in digits or words, wrong
ones (a wrong number, two candidates) do not, and every question is well formed."""
from __future__ import annotations

import pytest

from bench.quality import load_questions, table, ModelRun, Answer
from bench.quality_score import Question, by_category, categories, mentions, normalise_numbers, parse_questions, percent, score

MINUTES = Question("hours", "conversion", "How many minutes are in two hours?", (("120", "minutes"),))


@pytest.mark.parametrize(("text", "want"), [
    ("Two hours is one hundred and twenty minutes.", "2 hours is 120 minutes."),
    ("a hundred twenty", "120"),
    ("One hundred twenty-five", "125"),
    ("thirty-six hundred seconds", "3600 seconds"),
    ("A thousand minus one is nine hundred ninety-nine", "1000 minus 1 is 999"),
    ("two million three thousand and five", "2003005"),
    ("7,200 seconds, or 1,000,000 in all", "7200 seconds, or 1000000 in all"),
    ("It ended in nineteen forty-five.", "it ended in 1945."),
    ("twenty-seven and a half", "27.5"),
    ("one, two, three", "1, 2, 3"),  # a comma ends a number
    ("zero", "0"),
    ("I have a dog and a cat", "i have a dog and a cat"),  # "a" and "and" alone are words
    ("a hundred, and twenty", "100, and 20"),
])  # fmt: skip
def test_normalise_numbers(text: str, want: str) -> None:
    assert normalise_numbers(text) == want


@pytest.mark.parametrize("reply", [
    "There are 120 minutes in two hours.",
    "Two hours is one hundred and twenty minutes.",
    "That's a hundred twenty minutes!",
    "120 Minutes.",
])  # fmt: skip
def test_right_replies_pass(reply: str) -> None:
    assert score(reply, MINUTES)


@pytest.mark.parametrize("reply", [
    "two hours is 20 minutes",  # 20 is not 120
    "Two hours is twelve hundred minutes.",  # 1200
    "There are 1200 minutes in two hours.",
    "120.5 minutes",
    "It is 120.",  # every term of the alternative must appear
    "",
])  # fmt: skip
def test_wrong_replies_fail(reply: str) -> None:
    assert not score(reply, MINUTES)


def test_rejected_words_and_alternatives() -> None:
    ocean = Question("ocean", "facts", "Which ocean is the largest?", (("pacific",),), ("atlantic",))
    assert score("The Pacific Ocean is the largest.", ocean)
    assert not score("It is either the Pacific or the Atlantic.", ocean)
    assert not score("The specific answer is unclear.", ocean)  # whole words only
    painter = Question("art", "facts", "Who painted the Mona Lisa?", (("leonardo",), ("da vinci",)))
    assert score("It was painted by Da  Vinci.", painter) and score("Leonardo painted it.", painter)
    assert mentions("Shakespeare's play", "shakespeare") and not mentions("mice", "mouse")


def test_parse_rejects_bad_items() -> None:
    good = {"id": "a", "category": "c", "question": "Q?", "accept": [["x"]]}
    assert parse_questions([good, {**good, "id": "b", "accept": [[12, "eggs"]]}])[1].accept == (("12", "eggs"),)
    for bad in ([good, good], [{**good, "accept": []}], [{**good, "accept": ["x"]}], [{**good, "question": ""}],
                [{**good, "extra": 1}], []):  # fmt: skip
        with pytest.raises(ValueError):
            parse_questions(bad)


def test_question_file_is_well_formed() -> None:
    items = load_questions()
    assert len(items) >= 48 and len({q.id for q in items}) == len(items)
    assert set(categories(items)) == {"facts", "arithmetic", "conversion", "calendar", "everyday", "language"}
    assert all(sum(q.category == c for q in items) >= 5 for c in categories(items))
    for q in items:
        assert q.question.endswith("?") and not any(ch in q.question for ch in "*#+=/×÷^_`"), q  # spoken, not written
        assert not any(ch.isdigit() for ch in q.question), q  # numbers as said: in words
        # an accepted answer never contains a rejected word, or no reply could pass
        assert not any(mentions(" ".join(alt), r) for alt in q.accept for r in q.reject), q


def test_the_files_answers_on_real_replies() -> None:
    """Replies the models gave: right in words or digits, and wrong ones that name the answer backwards."""
    items = {q.id: q for q in load_questions()}
    assert score("September comes after August.", items["after-august"])
    assert not score("August comes after September.", items["after-august"])
    assert not score("Winter comes after spring.", items["after-winter"]) and score("Spring.", items["after-winter"])
    assert score("Seventy-two divided by eight equals nine.", items["divide"])
    assert score("One hour is equal to 3,600 seconds.", items["seconds-in-hour"])
    assert score("Thirty-six hundred.", items["seconds-in-hour"])
    assert score("A kilogram is a thousand grams.", items["g-in-kg"])
    assert not score("The square root of eighty-one is approximately 9.04.", items["square-root"])
    assert score("It ended in nineteen forty-five.", items["ww2-end"])
    assert not score("The biggest planet is Jupiter, then Saturn.", items["largest-planet"])


def test_tally_and_table() -> None:
    counts = by_category([("a", True), ("b", False), ("a", False), ("a", True)], order=["b", "a", "c"])
    assert counts == {"b": (0, 1), "a": (2, 3)} and percent(counts) == 50.0
    answers = tuple(Answer(str(i), c, "q", "r", ok, "stop", 100.0 * i, 20.0) for i, (c, ok) in
                    enumerate([("a", True), ("b", False), ("a", True)], start=1))  # fmt: skip
    lines = table([ModelRun("embedded", "x", None, 1.25, answers), ModelRun("missing", error="not found")], ["a", "b"])
    assert lines[0].startswith("| model | right / total | % | a | b |") and len(lines) == 3  # the missing one left out
    assert lines[2] == "| embedded | 2 / 3 | 67 | 2/2 | 0/1 | 200 | 20.0 | 1.2 |"


def test_questions_in_conversations_carry_the_greeting_and_every_reply_before_them() -> None:
    """--conversation N: N questions a session, each asked after the persona's greeting and the questions and replies
    before it; a new conversation starts from the greeting alone; each conversation's slot is released once."""
    from bench.quality import conversations
    from llm_engine.request import FinishEvent, Timings

    class Engine:
        def __init__(self) -> None:
            self.seen: list[tuple[str, tuple]] = []
            self.released: list[str] = []

        def submit(self, req):  # noqa: ANN001, ANN202
            self.seen.append((req.session_id, req.messages))
            reply = f"reply {len(self.seen)}"
            return type("S", (), {"collect": lambda s: ([], reply, FinishEvent("stop", Timings()))})()

        def release(self, session: str) -> None:
            self.released.append(session)

    items = tuple(Question(f"q{i}", "fact", f"Question {i}?", (("x",),)) for i in range(5))
    engine = Engine()
    answers = conversations(engine, "Be brief.", "Hi there.", items, 20, 2)
    assert [a.reply for a in answers] == [f"reply {i}" for i in range(1, 6)]
    turns = [[(m.role, m.content) for m in messages] for _, messages in engine.seen]
    assert turns[0] == [("system", "Be brief."), ("assistant", "Hi there."), ("user", "Question 0?")]
    assert turns[1] == [*turns[0], ("assistant", "reply 1"), ("user", "Question 1?")]
    assert turns[2] == [("system", "Be brief."), ("assistant", "Hi there."), ("user", "Question 2?")]  # a new one
    assert len({s for s, _ in engine.seen}) == 3 and sorted(engine.released) == sorted({s for s, _ in engine.seen})
