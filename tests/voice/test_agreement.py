from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from voice.agreement import LocalAgreement


def test_commits_the_prefix_two_hypotheses_agree_on():
    la = LocalAgreement(2)
    assert la.update("What is the") is None  # one hypothesis is not an agreement
    assert la.update("What is the weather") == "What is the"
    assert la.update("What is the weather like") == "weather"
    assert la.update("What is the weather like today?") == "like"
    assert la.committed == "What is the weather like"


def test_case_and_punctuation_do_not_break_agreement():
    la = LocalAgreement(2)
    la.update("hello there, how")
    assert la.update("Hello there. How are") == "Hello there. How"


def test_a_disagreeing_hypothesis_commits_nothing_and_changes_nothing():
    la = LocalAgreement(2)
    la.update("set a timer")
    la.update("set a timer for")
    assert la.committed == "set a timer"
    assert la.update("said a time for ten") is None
    assert la.update("said a time for ten minutes") is None
    assert la.committed == "set a timer"


words = st.sampled_from(["set", "a", "timer", "for", "ten", "minutes", "please", "the", "time"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(words, max_size=8).map(" ".join), min_size=1, max_size=10))
def test_committed_text_only_ever_grows(hypotheses):
    la = LocalAgreement(2)
    before: tuple[str, ...] = ()
    for hyp in hypotheses:
        la.update(hyp)
        now = la.committed_words
        assert now[: len(before)] == before
        before = now
