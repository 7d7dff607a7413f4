"""A lean GGUF reader: the metadata as plain Python values and each tensor as a read-only view of the mapped file.

gguf's own GGUFReader builds a numpy view for every part of every metadata field; a tokenizer of 49k tokens and
49k merges is ~250k views, ~6.5 s on a 2-core VM, paid by every engine start. Here the metadata is one pass of
struct reads over the header bytes (a few hundred ms), and tensors are views of one memory map, shaped as
GGUFReader shapes them (so gguf.quants.dequantize and our block unpackers read them the same way):
float types as their numpy dtype, quantized and bfloat16 ones as uint8 rows of blocks.

Layout (little-endian; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic "GGUF", version
(2 or 3), tensor count, field count; the fields (key, type, value); the tensor infos (name, dims innermost
first, type, offset); then the data, from the header's end rounded up to `general.alignment`.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# value types: their struct codes (8 string, 9 array are read apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64,
                 "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}  # fmt: skip
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class GgufTensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # innermost first, as the file (and GGUFReader) list them
    data: np.ndarray  # read-only view of the mapped file


class GgufError(ValueError):
    pass


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        except struct.error:
            raise GgufError(f"{self.path.name}: truncated GGUF header at byte {self.pos}") from None
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise GgufError(f"{self.path.name}: truncated GGUF header at byte {self.pos}")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item in _SCALARS:  # one read for the whole array
                code = _SCALARS[item]
                size = struct.calcsize("<" + code) * count  # standard sizes, as the read below
                if self.pos + size > len(self.buf):
                    raise GgufError(f"{self.path.name}: truncated GGUF header at byte {self.pos}")
                values = list(struct.unpack_from(f"<{count}{code}", self.buf, self.pos))
                self.pos += size
                return values
            return [self.value(item) for _ in range(count)]
        raise GgufError(f"{self.path.name}: unknown GGUF value type {kind} at byte {self.pos}")


class GgufFile:
    """fields: {key: value} (arrays as lists); tensors: in file order."""

    def __init__(self, path: str | Path) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = Path(path)
        with self.path.open("rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise GgufError(f"{self.path.name}: not a GGUF file (it starts {magic!r})")
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        cur = _Cursor(memoryview(self._map), self.path)  # type: ignore[arg-type]
        cur.pos = 4
        self.version = cur.take("I")
        if self.version not in (2, 3):
            raise GgufError(f"{self.path.name}: GGUF version {self.version} (big-endian or unknown); Parley reads 2 and 3")
        n_tensors, n_fields = cur.take("Q"), cur.take("Q")
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = cur.string()
            self.fields[key] = cur.value(cur.take("I"))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(cur.take("Q") for _ in range(cur.take("I")))
            infos.append((name, dims, cur.take("I"), cur.take("Q")))
        align = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        if align <= 0 or align & (align - 1):
            raise GgufError(f"{self.path.name}: general.alignment {align} is not a power of two")
        start = -(-cur.pos // align) * align
        self.tensors: list[GgufTensor] = []
        for name, dims, raw_type, offset in infos:
            try:
                kind = GGMLQuantizationType(raw_type)
            except ValueError:
                raise GgufError(f"{self.path.name}: tensor {name} has unknown type {raw_type}") from None
            block, type_size = GGML_QUANT_SIZES[kind]
            rows = tuple(reversed(dims))  # outermost first
            n = int(np.prod(dims, dtype=np.int64))
            begin, nbytes = start + offset, n * type_size // block
            if begin + nbytes > len(self._map):
                raise GgufError(f"{self.path.name}: tensor {name} runs past the end of the file")
            raw = self._map[begin : begin + nbytes]
            if kind.name in _FLOAT_DTYPES:
                data = raw.view(_FLOAT_DTYPES[kind.name]).reshape(rows)
            else:  # rows of blocks, in bytes
                data = raw.reshape(*rows[:-1], rows[-1] // block * type_size)
            self.tensors.append(GgufTensor(name, kind, dims, data))
