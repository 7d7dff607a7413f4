"""Our lean GGUF reader against gguf's own GGUFReader: the same metadata values and the same tensor views, on the
embedded model and on a small file of every value and tensor type we read; broken files get a one-line error."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llm_engine.gguf_file import GgufError, GgufFile


def assert_same_as_gguf_reader(path: Path) -> GgufFile:
    from gguf import GGUFReader

    ours, theirs = GgufFile(path), GGUFReader(str(path))
    assert list(ours.fields) == [k for k in theirs.fields if not k.startswith("GGUF.")]  # GGUF.*: its header, not fields
    for key, value in ours.fields.items():
        assert value == theirs.fields[key].contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(int(d) for d in b.shape), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data) and not a.data.flags.writeable, a.name
    return ours


def write_small_gguf(path: Path, alignment: int | None = None) -> None:
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint32("test.u32", 7)
    w.add_int32("test.i32", -3)
    w.add_float32("test.f32", 0.25)
    w.add_uint64("test.u64", 2**40)
    w.add_float64("test.f64", -1.5)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo")
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.strs", ["a", "", "ünïcode"])
    w.add_array("test.floats", [0.5, -2.0])
    a = rng.normal(size=(4, 64)).astype(np.float32)
    w.add_tensor("f32", a)
    w.add_tensor("f16", a.astype(np.float16))
    w.add_tensor("vec", rng.normal(size=5).astype(np.float32))  # an odd length: the next tensor is padded
    for kind in ("Q8_0", "Q4_0", "Q4_1", "BF16"):
        t = gguf.GGMLQuantizationType[kind]
        w.add_tensor(kind.lower(), quantize(a, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.slow
def test_the_embedded_model_reads_as_gguf_reads_it(smol_path: Path) -> None:
    f = assert_same_as_gguf_reader(smol_path)
    assert len(f.fields["tokenizer.ggml.tokens"]) == 49152 and f.fields["general.architecture"] == "llama"


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_value_and_tensor_type_reads_as_gguf_reads_it(tmp_path: Path, alignment: int | None) -> None:
    path = tmp_path / "small.gguf"
    write_small_gguf(path, alignment)
    f = assert_same_as_gguf_reader(path)
    assert f.fields["test.strs"] == ["a", "", "ünïcode"] and f.fields["test.u64"] == 2**40
    assert f.tensors[0].data.dtype == np.float32 and f.tensors[-1].data.dtype == np.uint8  # BF16: rows of bytes


def test_a_broken_file_is_named_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "small.gguf"
    write_small_gguf(good)
    raw = good.read_bytes()
    cases = {"not_gguf.gguf": b"PK\x03\x04" + raw[4:], "cut_in_header.gguf": raw[:200], "cut_in_data.gguf": raw[:-100],
             "version9.gguf": raw[:4] + (9).to_bytes(4, "little") + raw[8:], "empty.gguf": b""}  # fmt: skip
    messages = {"not_gguf.gguf": "not a GGUF file", "cut_in_header.gguf": "truncated GGUF header",
                "cut_in_data.gguf": "runs past the end of the file", "version9.gguf": "GGUF version 9",
                "empty.gguf": "not a GGUF file"}  # fmt: skip
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(GgufError, match=messages[name]) as err:
            GgufFile(tmp_path / name)
        assert name in str(err.value) and "\n" not in str(err.value)


def test_a_conversion_is_kept_for_the_same_bytes_and_not_for_changed_ones(tmp_path: Path) -> None:
    """The conversion cache is keyed by content: a reinstalled file (new mtime) finds its conversion; a file of the
    same size with a byte changed does not (keyed by mtime, each reinstall left a stale ~0.5 GB conversion)."""
    import os

    from llm_engine.gguf_loader import cache_folder_for

    path = tmp_path / "a" / "small.gguf"
    path.parent.mkdir()
    write_small_gguf(path)
    copy = tmp_path / "b" / "small.gguf"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    os.utime(copy, ns=(1, 1))
    assert cache_folder_for(copy, tmp_path) == cache_folder_for(path, tmp_path)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    copy.write_bytes(bytes(raw))
    assert cache_folder_for(copy, tmp_path) != cache_folder_for(path, tmp_path)
    assert cache_folder_for(path, tmp_path, weights=False).name.endswith("-meta")
