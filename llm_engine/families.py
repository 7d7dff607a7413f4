"""What differs between the model families the engine runs and that the rest of Parley must know: one record per
family (or per size, where a measurement differs by size). Today that is the end-of-turn text probe's calibration.

A model is matched by the name its file carries (a GGUF's general.basename and size_label, written beside the
converted config as model_name.json; a folder's config _name_or_path). It knows names and numbers, not files.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Family:
    name: str  # as a person names it
    # The probe's P(the user's text ends here) that counts as even odds of a finished turn (voice.turn_policy).
    # Fitted on the corpus's whole and half requests by bench.text_probe, relative to SmolLM2-135M's fit, whose
    # absolute value bench.turns tuned end to end with the audio model (docs/turn-taking.md)
    text_even_odds: float
    calibrated: bool = True  # False: a model nobody measured; the probe is read with the default calibration
    # Whether it calls tools when offered them (tool_choice auto), as bench.tools_default measured; None: unmeasured,
    # offered where its chat template renders tools (parley.tool_offer)
    calls_tools: bool | None = None
    # How a session's prompt words the tools, as bench.tools_default measured: "template" (its chat template's own
    # tool section, Tokenizer.system_with_tools) or "ours" (llm_engine.tool_format's prompt format)
    tools_wording: str = "template"


# (basename prefix, size label or "" for any) -> family. bench.text_probe, 2 cores, the assistant persona:
# fitted even odds 0.0462 (135M), 0.0501 (0.5B), 0.0684 (1.5B); whole requests' median P(end) 0.50 / 0.58 / 0.74,
# first halves' 0.008 / 0.011 / 0.005
_KNOWN: tuple[tuple[str, str, Family], ...] = (
    ("smollm2", "", Family("SmolLM2", 0.03)),
    # bench.tools_default (int4, as served), tool_choice auto, both write calls bare (llm_engine.tool_calls takes them):
    # the 0.5B chose the right tool 19 of 20 times with the template's wording, a call where none was wanted 1 of 12
    # (our prompt format: 18/20, 2/12); the 1.5B 17/20 and 0/12 in our format, but 0/20 in the template's (it
    # answers in words, with a made-up time). In a conversation (bench.e2e's 16 requests, spoken and typed) the 0.5B
    # called none ("here's a JSON object with the function name set_timer") and its other replies turned to "please
    # provide me with ...", for ~30-130 ms more voice to voice: not offered. The 1.5B set the timer and spoke the
    # result, and called nothing unwanted (docs/tools.md)
    ("qwen2.5", "0.5B", Family("Qwen2.5 0.5B", 0.03 * 0.0501 / 0.0462, calls_tools=False)),
    ("qwen2.5", "1.5B", Family("Qwen2.5 1.5B", 0.03 * 0.0684 / 0.0462, calls_tools=True, tools_wording="ours")),
)
UNKNOWN = Family("unmeasured", 0.03, calibrated=False)


def family_of(basename: str, size_label: str = "") -> Family:
    """The record for a model's base name ("Qwen2.5-Coder", "smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct") and size."""
    base = basename.lower().rsplit("/", 1)[-1]
    for prefix, size, family in _KNOWN:
        if base.startswith(prefix) and (not size or size.lower() in (size_label.lower(), *base.split("-"))):
            return family
    return UNKNOWN


def family_of_folder(folder: Path) -> Family:
    """From a converted GGUF's model_name.json, else a Hugging Face folder's config.json (_name_or_path)."""
    named = folder / "model_name.json"
    if named.exists():
        meta = json.loads(named.read_text())
        return family_of(str(meta.get("basename") or meta.get("name") or ""), str(meta.get("size_label") or ""))
    config = folder / "config.json"
    name = str(json.loads(config.read_text()).get("_name_or_path", "")) if config.exists() else ""
    return family_of(name, "")
