"""Config loading: the shipped config is valid; each kind of mistake is one clear line, exit 2."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli.main import main
from parley.config import DEFAULT_CONFIG, ConfigError, load_config


@pytest.fixture
def cfg_dir(tmp_path: Path) -> Path:
    """A writable copy of configs/ to break in different ways."""
    dst = tmp_path / "configs"
    shutil.copytree(DEFAULT_CONFIG.parent, dst)
    return dst


def test_default_config_loads_three_distinct_personas() -> None:
    cfg = load_config()
    assert cfg.server.host == "127.0.0.1" and cfg.server.port == 8000
    assert set(cfg.budgets_ms) == {"endpointing", "asr", "llm_ttft", "phrase", "tts", "send", "voice_to_voice"}
    personas = [cfg.persona(n) for n in cfg.personas]
    assert len(personas) >= 3
    for field in ("system_prompt", "greeting", "max_reply_tokens"):
        assert len({getattr(p, field) for p in personas}) == len(personas), field
    assert len({(p.voice, p.speaking_rate) for p in personas}) == len(personas)
    assert cfg.persona(None).name == cfg.default_persona


def test_config_objects_are_frozen() -> None:
    cfg = load_config()
    with pytest.raises(Exception):
        cfg.server.port = 1  # type: ignore[misc]


def test_set_overrides_parse_yaml_values() -> None:
    cfg = load_config(None, ["server.port=8123", "models.llm.quant=int8", "server.allowed_origins=[http://a]"])
    assert cfg.server.port == 8123
    assert cfg.models.llm.quant == "int8"
    assert cfg.server.allowed_origins == ("http://a",)


def test_the_audio_lead_reaches_each_session() -> None:
    from parley.runtime import session_settings

    assert session_settings(load_config()).audio_lead_ms == 1000.0
    assert session_settings(load_config(None, ["server.audio_lead_s=2.5"])).audio_lead_ms == 2500.0


@pytest.mark.parametrize(
    ("override", "key", "reason"),
    [
        ("server.bogus=1", "server.bogus", "unknown key"),
        ("server.port=eighty", "server.port", "valid integer"),
        ("server.audio_lead_s=0", "server.audio_lead_s", "greater than 0"),
        ("budgets_ms.asr=-5", "budgets_ms.asr", ">= 0"),
        ("models.llm.quant=int3", "models.llm.quant", "int8"),
        ("default_persona=nobody", "default_persona", "nobody"),
        ("vad.turn_detection=psychic", "vad.turn_detection", "combined"),
        ("vad.turn_unsure_prob=0.9", "vad", "turn_unsure_prob (0.9) is above turn_sure_prob (0.8)"),
        ("vad.turn_check_ms=3000", "vad", "turn_check_ms (3000) <= max_hangover_ms (1000)"),
        ("models.llm.backend=openai", "models", "backend openai needs remote.base_url"),
        ("models.asr.remote={base_url: llm:8000}", "models.asr.remote.base_url", "should match pattern"),
        ("voices.joe.backend=openai", "voices.joe", "backend openai needs remote.base_url"),
        ("server.openai_voices={alloy: morgan}", "server.openai_voices.alloy", "unknown voice 'morgan'"),
    ],
)
def test_bad_values_name_file_key_and_reason(override: str, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(str(DEFAULT_CONFIG))
    assert f": {key}:" in msg and reason in msg


def test_missing_persona_file(cfg_dir: Path) -> None:
    (cfg_dir / "personas" / "concise.yaml").unlink()
    with pytest.raises(ConfigError, match=r"default\.yaml: personas\[1\]: persona file .*concise\.yaml does not exist"):
        load_config(cfg_dir / "default.yaml")


def test_persona_with_unknown_voice(cfg_dir: Path) -> None:
    file = cfg_dir / "personas" / "storyteller.yaml"
    file.write_text(file.read_text().replace("voice: kal", "voice: morgan_freeman"))
    with pytest.raises(ConfigError, match=r"storyteller\.yaml: voice: unknown voice 'morgan_freeman'"):
        load_config(cfg_dir / "default.yaml")


def test_persona_with_wrong_type(cfg_dir: Path) -> None:
    file = cfg_dir / "personas" / "assistant.yaml"
    file.write_text(file.read_text().replace("max_reply_tokens: 120", "max_reply_tokens: lots"))
    with pytest.raises(ConfigError, match=r"assistant\.yaml: max_reply_tokens: .*valid integer"):
        load_config(cfg_dir / "default.yaml")


def test_invalid_yaml_and_missing_file(cfg_dir: Path, tmp_path: Path) -> None:
    (cfg_dir / "default.yaml").write_text("server: [unclosed\n")
    with pytest.raises(ConfigError, match=r"default\.yaml: line \d+: invalid YAML"):
        load_config(cfg_dir / "default.yaml")
    with pytest.raises(ConfigError, match="file does not exist"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "argv",
    [
        ["--set", "server.bogus=1", "models"],
        ["--set", "server.port=eighty", "models"],
        ["--set", "budgets_ms.tts=-1", "models"],
        ["--config", "/nonexistent/parley.yaml", "models"],
    ],
)
def test_cli_prints_one_line_and_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("parley: config error: ") and err.count("\n") == 1
