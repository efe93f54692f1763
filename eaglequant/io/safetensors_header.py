"""Strict reading of a safetensors file's header, without touching tensor data.

The safetensors format is an 8-byte little-endian header length, a JSON header
mapping tensor names to ``dtype``, ``shape`` and ``data_offsets`` (relative to
the end of the header), then the raw bytes. This module checks every field of
the header against the file's size, so that a truncated or forged file is
refused with a clear message before any library maps it.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from eaglequant.errors import InputError

DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file, dtype, shape and absolute byte range."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def same_bytes(self, other: TensorInfo, chunk: int = 1 << 24) -> bool:
        """True when both tensors are stored with identical bytes (compared chunk by chunk)."""
        if (self.dtype, self.shape, self.nbytes) != (other.dtype, other.shape, other.nbytes):
            return False
        with self.file.open("rb") as mine, other.file.open("rb") as theirs:
            mine.seek(self.start)
            theirs.seek(other.start)
            remaining = self.nbytes
            while remaining:
                size = min(chunk, remaining)
                if mine.read(size) != theirs.read(size):
                    return False
                remaining -= size
        return True


@dataclass(frozen=True)
class SafetensorsHeader:
    """A parsed header: the tensors of one file and its ``__metadata__``."""

    file: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int


def read_header(path: Path) -> SafetensorsHeader:
    """Read and check the header of ``path``; raise InputError naming what is wrong."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise InputError(
                    f"{path}: not a safetensors file (only {size} bytes); "
                    "re-download or re-export it"
                )
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                raise InputError(
                    f"{path}: safetensors header length {header_len} exceeds the file size "
                    f"{size}; the file is truncated or corrupt, re-download or re-export it"
                )
            raw = handle.read(header_len)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror}); check the path") from exc
    return parse_header(path, raw, size)


def parse_header(path: Path, raw: bytes, file_size: int) -> SafetensorsHeader:
    """Check a raw header (the JSON bytes) against the size of the file it came from."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(
            f"{path}: safetensors header is not valid JSON ({exc}); the file is corrupt, "
            "re-download or re-export it"
        ) from exc
    if not isinstance(header, dict):
        raise InputError(f"{path}: safetensors header is not a JSON object; the file is corrupt")
    data_start = 8 + len(raw)
    data_size = file_size - data_start
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise InputError(f"{path}: safetensors __metadata__ must map strings to strings")
    tensors = {
        name: _parse_entry(path, name, entry, data_start, data_size)
        for name, entry in header.items()
    }
    _check_no_overlap(path, tensors)
    return SafetensorsHeader(path, tensors, dict(metadata), data_start)


def _parse_entry(
    path: Path, name: str, entry: object, data_start: int, data_size: int
) -> TensorInfo:
    where = f"{path}: tensor '{name}'"
    if not isinstance(entry, dict):
        raise InputError(f"{where}: header entry is not an object; the file is corrupt")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        raise InputError(f"{where}: unknown dtype {dtype!r}; the file is corrupt or unsupported")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise InputError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise InputError(f"{where}: data_offsets {offsets!r} are not [begin, end] with begin<=end")
    begin, end = offsets
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != expected:
        raise InputError(
            f"{where}: data_offsets {offsets} span {end - begin} bytes but {dtype}{shape} "
            f"needs {expected}; the file is corrupt"
        )
    if end > data_size:
        raise InputError(
            f"{where}: data_offsets {offsets} run past the end of the data ({data_size} bytes); "
            "the file is truncated, re-download or re-export it"
        )
    return TensorInfo(name, path, dtype, tuple(shape), data_start + begin, data_start + end)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_no_overlap(path: Path, tensors: dict[str, TensorInfo]) -> None:
    ordered = sorted((t for t in tensors.values() if t.nbytes), key=lambda t: t.start)
    for before, after in itertools.pairwise(ordered):
        if after.start < before.end:
            raise InputError(
                f"{path}: tensors '{before.name}' and '{after.name}' overlap in the file; "
                "the file is corrupt, re-export it"
            )
