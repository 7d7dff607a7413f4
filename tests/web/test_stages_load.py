"""`parley stages --only X` loads X and nothing else: not the VAD, not Smart Turn (voice sessions need those, and a
stage server runs none), not the other stages. Counted where every model file is found (parley.runtime.resolve), where
a VAD or Smart Turn is built, and by the server's own account of what it loaded (/healthz load_s), on the real loader."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.parley_process import ParleyProcess
from cli import main as cli
from parley import runtime as rt
from parley.config import load_config
from voice.smart_turn import SmartTurn
from voice.vad import SileroVad, WebRtcVad

pytestmark = pytest.mark.slow


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What the loader did, in order: each stage whose model file it looked up (parley.runtime.resolve), and each
    VAD or Smart Turn model it built (by class name, whichever backend the config names)."""
    seen: list[str] = []
    real = rt.resolve

    def counting(stage: str, *args: Any, **kwargs: Any) -> Path:
        seen.append(stage)
        return real(stage, *args, **kwargs)

    monkeypatch.setattr(rt, "resolve", counting)
    for cls in (SileroVad, WebRtcVad, SmartTurn):
        def built(self: Any, *args: Any, _init: Any = cls.__init__, _name: str = cls.__name__, **kwargs: Any) -> None:
            seen.append(_name)
            _init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", built)
    yield seen


@pytest.mark.parametrize("only", ["llm", "asr", "tts"])
def test_a_stage_server_for_one_stage_loads_that_stage_alone(loaded: list[str], only: str) -> None:
    cfg = cli._load(cli._parser().parse_args(["stages", "--only", only]))
    assert cfg.vad.turn_detection == "combined"  # the shipped config: a voice session would load Smart Turn
    runtime = rt.load(cfg, cfg.server.stages, sessions=False)  # what `parley stages` loads (cli.serve, stages_only)
    try:
        assert loaded == [only]  # no VAD, no Smart Turn, no other stage's model
        assert set(runtime.load_s) == {only} and runtime.stages.turn_model is None
        with pytest.raises(RuntimeError, match="vad is not loaded by this process"):
            runtime.stages.make_vad()
    finally:
        runtime.close()


def test_voice_sessions_load_the_vad_and_the_turn_model_beside_the_stages(loaded: list[str]) -> None:
    """The spies see the VAD and Smart Turn when they are loaded: the test above would catch them."""
    runtime = rt.load(load_config(None, ["vad.turn_detection=combined"]), ["llm"])
    try:
        assert loaded == ["vad", "SileroVad", "llm", "turn", "SmartTurn"]
        assert set(runtime.load_s) == {"llm", "turn", "vad"} and runtime.stages.turn_model is not None
    finally:
        runtime.close()


def test_the_parley_stages_command_with_only_llm_loads_the_llm_alone(tmp_path: Path) -> None:
    """The command itself, as a process: what it says it loaded, and its routes."""
    server = ParleyProcess(tmp_path / "stages.log", command="stages", args=("--only", "llm")).start()
    try:
        health = httpx.get(server.url + "/healthz", timeout=10).json()
        assert health["stages"] == ["llm"] and set(health["load_s"]) == {"llm"}, health
        owners = [m["owned_by"] for m in httpx.get(server.url + "/v1/models", timeout=10).json()["data"]]
        assert owners == ["parley (chat)"], owners
    finally:
        server.stop()
    assert server.proc is not None and server.proc.poll() is not None
