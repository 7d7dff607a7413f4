"""`parley models`: one row per stage (and per TTS voice) saying where its weights are.

Resolves through parley.locate; never loads a model.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass

from parley.config import AppConfig
from parley.embedded_llms import EMBEDDED_LLMS, EmbeddedLlm, embedded_llm
from parley.joined_file import PartError
from parley.locate import EMBEDDED, ModelNotFound, package_dir, resolve, size_bytes

_APT = {"flite": "apt-get install -y flite", "espeak-ng": "apt-get install -y espeak-ng"}


@dataclass(frozen=True)
class ModelRow:
    stage: str
    source: str
    path: str
    size_bytes: int
    present: bool
    fix: str  # how to install it when missing, else ""
    model: str = ""  # what an embedded LLM is, as a person names it


def _row(stage: str, source: str, allow: bool) -> ModelRow:
    try:
        path = resolve(stage, source, allow_downloads=allow)
    except ModelNotFound as exc:
        entry = EMBEDDED.get((stage, source))
        return ModelRow(stage, source, "-", 0, False, entry.install if entry else str(exc))
    return ModelRow(stage, source, str(path), size_bytes(path), True, "")


def _llm_rows(source: str, allow: bool) -> list[ModelRow]:
    """The configured LLM (an embedded one named with the model it is), then the other embedded LLMs one setting
    away, checked for their packages without joining their parts."""
    chosen = embedded_llm(source)
    row = _row("llm", source, allow)
    if chosen is None:
        return [row]
    named = f"{source} = {chosen.name}" if source == "embedded" else source
    rows = [ModelRow("llm", named, row.path, row.size_bytes, row.present, row.fix, chosen.model)]
    for other in EMBEDDED_LLMS.values():
        if other.name != chosen.name:
            present, fix = _installed(other)
            rows.append(ModelRow("llm (selectable)", other.name, "-", 0, present, fix, other.model))
    return rows


def _installed(llm: EmbeddedLlm) -> tuple[bool, str]:
    """Whether an embedded LLM's packages are installed (-> (present, the install command when not))."""
    if llm.joined is not None:
        try:
            llm.joined.part_paths()
        except PartError:
            return False, llm.install
        return True, ""
    root = package_dir(llm.package)
    present = root is not None and (root / llm.relpath).exists()
    return present, "" if present else llm.install


def model_rows(cfg: AppConfig) -> list[ModelRow]:
    m, allow = cfg.models, cfg.models.allow_downloads
    rows = []
    if m.vad.backend == "silero":
        rows.append(_row("vad", m.vad.source, allow))
    else:
        rows.append(ModelRow("vad", "webrtc", "(built into webrtcvad)", 0, True, ""))
    if cfg.vad.turn_detection in ("smart_turn", "combined"):
        rows.append(_row("turn", m.turn.source, allow))
    rows.append(_row("asr", m.asr.source, allow))
    rows.extend(_llm_rows(m.llm.source, allow))
    for name, voice in cfg.voices.items():
        stage = f"tts:{name}"
        if voice.backend == "piper":
            row = _row("tts", voice.source, allow)
            rows.append(ModelRow(stage, f"piper {voice.source}", row.path, row.size_bytes, row.present, row.fix))
        elif voice.backend in _APT:
            exe = shutil.which(voice.backend)
            rows.append(ModelRow(stage, voice.backend, exe or "-", 0, exe is not None, "" if exe else _APT[voice.backend]))
        else:
            rows.append(ModelRow(stage, voice.backend, "(optional backend)", 0, False, "pip install 'parley[coqui]'"))
    return rows


def print_models(cfg: AppConfig) -> bool:
    """Print the table; True when every model is present."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Parley models")
    for col in ("stage", "source", "model", "path", "size", "status"):
        table.add_column(col, overflow="fold")
    rows = model_rows(cfg)
    for r in rows:
        size = f"{r.size_bytes / 1e6:.1f} MB" if r.size_bytes else "-"
        status = "present" if r.present else f"missing: {r.fix}"
        table.add_row(r.stage, r.source, r.model, r.path, size, status)
    Console(width=200).print(table)
    return all(r.present for r in rows if r.stage != "llm (selectable)")
