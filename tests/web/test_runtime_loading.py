"""load_and_warm runs on a thread of its own that is gone when it returns, and hands its errors back."""
from __future__ import annotations

import threading

import pytest

from parley import runtime as rt
from parley.config import load_config
from parley.locate import ModelNotFound


def test_loading_runs_on_a_thread_that_has_exited(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[threading.Thread] = []
    sentinel = object()

    def fake_load(cfg, stages=rt.ALL_STAGES, sessions=True):
        seen.append(threading.current_thread())
        return sentinel

    monkeypatch.setattr(rt, "load", fake_load)
    monkeypatch.setattr(rt, "warm", lambda runtime: seen.append(threading.current_thread()))
    assert rt.load_and_warm(load_config(None)) is sentinel
    assert len(seen) == 2 and seen[0] is seen[1]
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()  # its OpenMP pool went with it


def test_a_loading_error_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(cfg, stages=rt.ALL_STAGES, sessions=True):
        raise ModelNotFound("llm: no such model: nowhere.gguf")

    monkeypatch.setattr(rt, "load", missing)
    with pytest.raises(ModelNotFound, match="nowhere.gguf"):
        rt.load_and_warm(load_config(None))
