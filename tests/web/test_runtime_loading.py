"""load_and_warm runs on a thread of its own that is gone when it returns, and hands its errors back; warm() runs
the recogniser on speech; the default persona's prompt goes through the engine once, as a session's first warm-up
would send it, so the engine pins it."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from parley import runtime as rt
from parley.config import load_config
from parley.locate import ModelNotFound


def test_loading_runs_on_a_thread_that_has_exited(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[threading.Thread] = []
    sentinel = SimpleNamespace(engine_turn_share=None)

    def fake_load(cfg, stages=rt.ALL_STAGES, sessions=True):
        seen.append(threading.current_thread())
        return sentinel

    monkeypatch.setattr(rt, "load", fake_load)
    monkeypatch.setattr(rt, "warm", lambda runtime: seen.append(threading.current_thread()))
    monkeypatch.setattr(rt, "pin_persona_prompt", lambda runtime, cfg: seen.append(threading.current_thread()))
    monkeypatch.setattr(rt, "calibrate_engine", lambda runtime, cfg: seen.append(threading.current_thread()) or 0.25)
    assert rt.load_and_warm(load_config(None)) is sentinel
    assert len(seen) == 4 and all(t is seen[0] for t in seen) and sentinel.engine_turn_share == 0.25
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()  # its OpenMP pool went with it


def test_a_loading_error_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(cfg, stages=rt.ALL_STAGES, sessions=True):
        raise ModelNotFound("llm: no such model: nowhere.gguf")

    monkeypatch.setattr(rt, "load", missing)
    with pytest.raises(ModelNotFound, match="nowhere.gguf"):
        rt.load_and_warm(load_config(None))


class _Voice:
    sample_rate = 22050

    def synthesize(self, text: str, *, rate: float = 1.0, voice: str | None = None):
        yield np.full(11025, 0.1, dtype=np.float32)  # half a second at 22.05 kHz, in two chunks
        yield np.full(11025, -0.1, dtype=np.float32)


def test_the_recogniser_and_turn_model_are_warmed_on_speech_the_first_voice_said_and_on_every_worker() -> None:
    from voice.scheduler import DirectRunner, StageScheduler
    from voice.stage_queue import Policy

    heard: list[tuple[str, np.ndarray]] = []
    scored: list[tuple[str, np.ndarray]] = []
    on = lambda seen: lambda audio: seen.append((threading.current_thread().name, audio))  # noqa: E731
    workers = StageScheduler(Policy(workers=3, partial_workers=1, background_workers=1), name="stage")
    stages = SimpleNamespace(
        voices={"a": SimpleNamespace(tts=_Voice(), speaker=None)},
        transcriber=SimpleNamespace(transcribe=on(heard)),
        turn_model=SimpleNamespace(complete_prob=on(scored)),
        runner=workers,
    )
    try:
        rt.warm(rt.Runtime(stages=stages, engine=None, sessions=False))  # type: ignore[arg-type]
    finally:
        workers.close()
    speech = heard[0][1]
    assert abs(len(speech) - 16000) < 50  # the voice's 1 s, at 16 kHz
    assert speech[:8000].mean() > 0.05 and speech[-4000:].mean() < -0.05  # its audio, not noise
    assert all(audio is speech for _, audio in heard + scored)
    # here, and then once on each stage worker (per-thread first runs): where users' checks and finals run
    assert sorted(name for name, _ in heard[1:]) == sorted(name for name, _ in scored[1:]) == ["stage-0", "stage-1", "stage-2"]
    heard.clear()
    rt.warm(rt.Runtime(stages=SimpleNamespace(voices={}, transcriber=stages.transcriber, turn_model=None,
                                              runner=DirectRunner()), engine=None, sessions=False))  # type: ignore[arg-type]
    assert len(heard) == 1 and len(heard[0][1]) == 16000 and abs(float(heard[0][1].mean())) < 0.01  # no local voice: noise


class _Engine:
    """What pin_persona_prompt uses of the engine: submit (iterated to its end), release, prefix_cache."""

    prefix_cache = True

    def __init__(self) -> None:
        self.requests: list = []
        self.released: list[str] = []

    def submit(self, request):
        self.requests.append(request)
        return iter(())

    def release(self, session_id: str) -> None:
        self.released.append(session_id)


def _llm(wording):
    return SimpleNamespace(native_tools=False, system_with_tools=wording, supports_tools=False)


def test_the_default_personas_system_prompt_is_prefilled_once_as_a_session_words_it() -> None:
    from voice.tool_turn import with_tools

    cfg = load_config(None)
    engine = _Engine()
    runtime = rt.Runtime(stages=SimpleNamespace(llm=_llm(lambda text, tools: None)), engine=engine)  # type: ignore[arg-type]
    rt.pin_persona_prompt(runtime, cfg)
    (request,) = engine.requests
    persona = rt.persona_spec(cfg, cfg.default_persona, rt.llm_tool_support(runtime.stages.llm))
    want = with_tools(persona.system_prompt, persona, native=False, wording=runtime.stages.llm.system_with_tools)
    assert [(m.role, m.content) for m in request.messages] == [("system", want)]  # what Session.messages() starts with
    assert persona.system_prompt in want and request.sampling.max_new_tokens == 0  # a prefill: the engine pins it
    assert engine.released == [request.session_id]
    # nothing to pin: a remote LLM (no engine), stages without the LLM, or an engine without the prefix cache
    for runtime in (rt.Runtime(stages=runtime.stages, engine=None),  # type: ignore[arg-type]
                    rt.Runtime(stages=runtime.stages, engine=engine, served=frozenset({"asr"}))):  # type: ignore[arg-type]
        rt.pin_persona_prompt(runtime, cfg)
    engine.prefix_cache = False
    rt.pin_persona_prompt(rt.Runtime(stages=runtime.stages, engine=engine), cfg)  # type: ignore[arg-type]
    assert len(engine.requests) == 1


class _TimedEngine(_Engine):
    """Answers a request with a finish whose timings say what its prefill and decode cost a token."""

    def __init__(self, prefill: tuple[int, float], decode: tuple[int, float]) -> None:
        super().__init__()
        self.prefill, self.decode = prefill, decode

    def submit(self, request):
        from llm_engine.engine import FinishEvent, Timings

        self.requests.append(request)
        (pt, pms), (dt, dms) = self.prefill, self.decode
        return iter([FinishEvent("length", Timings(prefill_ms=pms, prefill_tokens=pt, decode_ms=dms, decode_tokens=dt))])


def test_the_engine_is_timed_at_start_as_a_talking_session_would_use_it() -> None:
    cfg = load_config(None)
    stages = SimpleNamespace(llm=_llm(lambda text, tools: None))
    engine = _TimedEngine(prefill=(50, 500.0), decode=(24, 432.0))  # 10 ms a prompt token, 18 a reply token
    share = rt.calibrate_engine(rt.Runtime(stages=stages, engine=engine), cfg)  # type: ignore[arg-type]
    turn_s = (rt.TURN_PROMPT_TOKENS * 10.0 + rt.TURN_REPLY_TOKENS * 18.0) / 1000
    assert share == pytest.approx(turn_s / rt.TURN_PERIOD_S)
    (request,) = engine.requests
    assert request.messages[0].role == "system" and request.messages[-1].role == "user" and request.sampling.max_new_tokens > 0
    assert engine.released == [request.session_id]
    slow = _TimedEngine(prefill=(50, 50_000.0), decode=(24, 24_000.0))  # a second a token: all of the engine
    assert rt.calibrate_engine(rt.Runtime(stages=stages, engine=slow), cfg) == 1.0  # type: ignore[arg-type]
    # nothing to time: no engine of ours, or a finish that decoded nothing
    assert rt.calibrate_engine(rt.Runtime(stages=stages, engine=None), cfg) is None  # type: ignore[arg-type]
    assert rt.calibrate_engine(rt.Runtime(stages=stages, engine=_TimedEngine((50, 500.0), (0, 0.0))), cfg) is None  # type: ignore[arg-type]
