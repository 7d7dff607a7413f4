"""Resume tokens as a pure core: good once, only after the drop, only in the window, only for its auth token."""
from __future__ import annotations

import pytest

from web.resume import ResumeTokens


def test_a_token_resumes_once_within_the_window_after_its_connection_drops() -> None:
    early = ResumeTokens(window_s=60.0)
    assert early.take(early.issue("c0", auth=""), "", now_s=0.0) == "c0"  # the server has not seen the drop yet
    tokens = ResumeTokens(window_s=60.0)
    token = tokens.issue("c1", auth="")
    tokens.hold("c1", now_s=10.0)
    assert tokens.held() == 1
    assert tokens.take(token, "", now_s=69.0) == "c1"
    with pytest.raises(ValueError, match="unknown or already used"):
        tokens.take(token, "", now_s=69.0)
    assert tokens.held() == 0


def test_an_expired_a_foreign_and_a_replaced_token_do_not_resume() -> None:
    tokens = ResumeTokens(window_s=5.0)
    old = tokens.issue("c1", auth="alice")
    new = tokens.issue("c1", auth="alice")  # a newer connection of the same conversation: the old token is gone
    tokens.hold("c1", now_s=0.0)
    with pytest.raises(ValueError, match="unknown"):
        tokens.take(old, "alice", now_s=1.0)
    with pytest.raises(ValueError, match="another client"):
        tokens.take(new, "mallory", now_s=1.0)
    with pytest.raises(ValueError, match="expired"):
        tokens.take(new, "alice", now_s=5.5)
    assert tokens.expired(now_s=5.5) == ["c1"] and tokens.expired(now_s=6.0) == []
    assert len({ResumeTokens(1.0).issue("x", "") for _ in range(50)}) == 50  # unguessable: never the same twice


def test_past_max_held_the_conversations_held_longest_end() -> None:
    tokens = ResumeTokens(window_s=60.0, max_held=2)
    for i, cid in enumerate(["a", "b", "c"]):
        tokens.issue(cid, auth="")
    assert tokens.hold("a", now_s=0.0) == [] and tokens.hold("b", now_s=1.0) == []
    assert tokens.hold("c", now_s=2.0) == ["a"] and tokens.held() == 2


def test_a_user_is_known_by_their_id_under_their_auth_token() -> None:
    from web.resume import owner_of

    assert owner_of("tok", None) == ""  # no user named: nobody to remember
    assert owner_of("tok", "ana") == owner_of("tok", "ana") != owner_of("tok", "bo")
    assert owner_of("tok", "ana") != owner_of("other-token", "ana")  # the same id under another token is someone else
