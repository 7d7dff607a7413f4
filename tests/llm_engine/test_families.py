"""Model family records: a file's name finds its record, and the turn policy reads the text probe at that record's
even odds (a better-calibrated or another model must not inherit SmolLM2's)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.text_probe import fit_even_odds
from llm_engine.families import UNKNOWN, family_of, family_of_folder
from llm_engine.gguf_loader import prepare_gguf
from parley.locate import find_embedded
from voice.turn_policy import TEXT_EVEN_ODDS, TurnPolicy


def test_names_find_their_records() -> None:
    small = family_of("smollm2", "135M")
    assert small.calibrated and small.text_even_odds == TEXT_EVEN_ODDS
    half, one_and_half = family_of("Qwen2.5-Coder", "0.5B"), family_of("Qwen2.5-Coder", "1.5B")
    assert half.calibrated and one_and_half.calibrated and half != one_and_half
    assert family_of("HuggingFaceTB/SmolLM2-135M-Instruct") == small
    assert family_of("Qwen/Qwen2.5-1.5B-Instruct") == one_and_half  # a folder's _name_or_path carries the size
    assert family_of("Qwen2.5-Coder", "7B") == UNKNOWN and not UNKNOWN.calibrated
    assert family_of("Llama-3.2", "1B") == UNKNOWN


def test_a_converted_gguf_keeps_its_name(tmp_path: Path) -> None:
    folder = prepare_gguf(find_embedded("llm", "embedded-0.5b"), tmp_path, weights=False, progress=False)
    assert json.loads((folder / "model_name.json").read_text())["size_label"] == "0.5B"
    assert family_of_folder(folder) == family_of("Qwen2.5-Coder", "0.5B")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"_name_or_path": "HuggingFaceTB/SmolLM2-360M-Instruct"}))
    assert family_of_folder(hf).name == "SmolLM2"


@pytest.mark.parametrize("even", [0.03, 0.05])
def test_the_policy_reads_the_probe_at_the_models_even_odds(even: float) -> None:
    policy = TurnPolicy(detection="text", text_even_odds=even)
    assert policy.complete_prob(None, even) == pytest.approx(0.5)
    assert policy.complete_prob(None, 4 * even) == pytest.approx(0.8)


def test_the_fit_finds_where_finished_and_unfinished_texts_balance() -> None:
    # P(complete) = p / (p + even): texts scored 0.2 are finished 4 times in 5 when even = 0.05
    probs = [0.2] * 5 + [0.0125] * 5
    labels = [True, True, True, True, False] + [True, False, False, False, False]
    assert fit_even_odds(probs, labels) == pytest.approx(0.05, rel=0.02)
