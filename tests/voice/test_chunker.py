"""Phrase boundaries of the pure chunker, fed in deltas of every size."""
from __future__ import annotations

import pytest

from voice.chunker import PhraseChunker


def chunk(text: str, step: int = 3, **kwargs) -> list[str]:
    c = PhraseChunker(**kwargs)
    out: list[str] = []
    for i in range(0, len(text), step):
        out += c.push(text[i : i + step])
    return out + c.flush()


@pytest.mark.parametrize("step", [1, 2, 5, 17, 1000])
def test_phrases_do_not_depend_on_how_the_text_was_split(step):
    text = "Sure, I can help with that. Dr. Smith arrives at 10:30 tomorrow. It costs 3.50 dollars, e.g. cheap!"
    assert chunk(text, step) == [
        "Sure, I can help with that.",
        "Dr. Smith arrives at 10:30 tomorrow.",
        "It costs 3.50 dollars, e.g. cheap!",
    ]


def test_first_phrase_ends_at_the_first_clause():
    # a one-word clause ("Well,") is too short to stand alone
    assert chunk("Well, the weather looks great today. Enjoy it.")[0] == "Well, the weather looks great today."
    assert chunk("Of course, here is a quick plan for your day. First, eat.")[:2] == [
        "Of course,",
        "here is a quick plan for your day.",
    ]


def test_first_phrase_without_punctuation_is_cut_within_eight_words():
    phrases = chunk("The quickest way to get to the station from here is to take the number five bus. It is fast.")
    assert phrases[0] == "The quickest way to get"  # cut before "to", not mid-thought
    assert len(phrases[0].split()) <= 8
    assert phrases[1:] == ["to the station from here is to take the number five bus.", "It is fast."]


@pytest.mark.parametrize(
    "text",
    [
        "one two three four five six seven eight nine ten eleven twelve",
        "Honestly I really truly think every single person here deserves a raise.",
        "Photosynthesis transforms sunlight carbon dioxide water into glucose oxygen.",
    ],
)
def test_first_phrase_never_exceeds_eight_words(text):
    for first_words in (4, 6, 8):
        assert 1 <= len(chunk(text, first_words=first_words)[0].split()) <= 8


def test_later_phrases_end_at_sentence_ends_not_clauses():
    phrases = chunk("Hi. Paris is lovely in spring, with mild weather, and the parks are green. Go!")
    assert phrases == ["Hi.", "Paris is lovely in spring, with mild weather, and the parks are green.", "Go!"]


def test_abbreviations_initials_decimals_and_times_stay_whole():
    phrases = chunk("Hi. Mr. J. R. Tolkien met Prof. Lee at 7 p.m. in the U.S. and paid 4.99 at 09:45. Bye.")
    assert phrases == ["Hi.", "Mr. J. R. Tolkien met Prof. Lee at 7 p.m. in the U.S. and paid 4.99 at 09:45.", "Bye."]


def test_questions_exclamations_ellipses_and_quotes_end_sentences():
    phrases = chunk('OK. Are you sure? Yes! Well... He said "go." Then we left.')
    assert phrases == ["OK.", "Are you sure?", "Yes!", "Well...", 'He said "go."', "Then we left."]


def test_markdown_emoji_and_code_fences_are_not_spoken():
    text = (
        "**Great question!** 😊 Here is a list:\n\n# Steps\n1. Boil the *water*\n2. Add the [tea](http://x.com/a)\n"
        "- Wait `five` minutes\n\n```python\nprint('never read this')\n```\nDone. I hope this helps 👍.\n"
    )
    phrases = chunk(text)
    assert phrases == [
        "Great question!",
        "Here is a list:",
        "Steps",
        "Boil the water",
        "Add the tea",
        "Wait five minutes",
        "Done.",
        "I hope this helps.",
    ]
    spoken = " ".join(phrases)
    assert not any(mark in spoken for mark in ("*", "#", "`", "http", "print", "😊", "👍"))


def test_a_run_on_sentence_is_cut_at_a_clause_after_max_words():
    text = "Hi. " + ", ".join(["word word word word"] * 12) + "."
    phrases = chunk(text, max_words=10)
    assert all(len(p.split()) <= 20 for p in phrases)
    assert " ".join(phrases).replace(",", "") == text.replace(",", "")


def test_flush_returns_the_unfinished_tail_and_resets():
    c = PhraseChunker()
    assert c.push("Sure thing. The answer is forty") == ["Sure thing."]
    assert c.flush() == ["The answer is forty"]
    assert c.flush() == []
