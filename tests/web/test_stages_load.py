"""`parley stages --only llm` loads the LLM and nothing else: not the VAD, not Smart Turn (voice sessions need those,
and a stage server runs none). Counted where every model file is found (parley.runtime.resolve) and by the server's
own account of what it loaded (/healthz load_s), on the real loader."""
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

pytestmark = pytest.mark.slow


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The stages whose model files the loader looks up, in order."""
    stages: list[str] = []
    real = rt.resolve

    def counting(stage: str, *args: Any, **kwargs: Any) -> Path:
        stages.append(stage)
        return real(stage, *args, **kwargs)

    monkeypatch.setattr(rt, "resolve", counting)
    yield stages


def test_a_stage_server_for_the_llm_loads_no_vad_and_no_turn_model(resolved: list[str]) -> None:
    cfg = cli._load(cli._parser().parse_args(["stages", "--only", "llm"]))
    assert cfg.vad.turn_detection == "combined"  # the shipped config: a voice session would load Smart Turn
    runtime = rt.load(cfg, cfg.server.stages, sessions=False)
    try:
        assert resolved == ["llm"]
        assert set(runtime.load_s) == {"llm"} and runtime.stages.turn_model is None
        with pytest.raises(RuntimeError, match="vad is not loaded by this process"):
            runtime.stages.make_vad()
    finally:
        runtime.close()


def test_voice_sessions_load_the_vad_and_the_turn_model_beside_the_stages(resolved: list[str]) -> None:
    runtime = rt.load(load_config(None, ["vad.turn_detection=combined"]), ["llm"])
    try:
        assert sorted(resolved) == ["llm", "turn", "vad"]
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
