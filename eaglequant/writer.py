"""Writing safetensors checkpoints: sharding, index, and streamed pass-through tensors.

Tensors are written as blobs: either bytes in memory (a quantized weight) or a
byte range of an input file (a tensor passed through unchanged, copied without
being decoded, so ``fc``/``lm_head``/``embed_tokens`` stay byte-identical and
are never held in memory twice). Sharding follows huggingface_hub's
``split_state_dict_into_shards_factory`` (HF file names, ``{"format": "pt"}``
metadata, ``model.safetensors.index.json`` with ``total_size``).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eaglequant.checkpoint import INDEX_FILE, SINGLE_FILE
from eaglequant.errors import InputError
from eaglequant.safetensors_header import DTYPE_SIZES, TensorInfo

if TYPE_CHECKING:
    import torch

FILE_MODE = 0o644
COPY_CHUNK = 64 * 1024 * 1024
DEFAULT_MAX_SHARD_SIZE = "5GB"


@dataclass(frozen=True)
class TensorBlob:
    """One tensor to write: dtype, shape, and either in-memory bytes or an input byte range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes | None = None
    source: TensorInfo | None = None

    @property
    def nbytes(self) -> int:
        return len(self.data) if self.data is not None else self.source.nbytes  # type: ignore[union-attr]


def blob_from_file(info: TensorInfo) -> TensorBlob:
    """A tensor copied byte for byte from its input file."""
    return TensorBlob(info.name, info.dtype, info.shape, source=info)


def blob_from_tensor(name: str, tensor: torch.Tensor) -> TensorBlob:
    """A tensor held in memory, stored in its own dtype."""
    import torch

    dtype = torch_to_safetensors_dtype(tensor.dtype)
    flat = tensor.detach().contiguous().cpu().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return TensorBlob(name, dtype, tuple(tensor.shape), data=data)


def torch_to_safetensors_dtype(dtype: torch.dtype) -> str:
    import torch

    names = {
        torch.bool: "BOOL",
        torch.uint8: "U8",
        torch.int8: "I8",
        torch.int16: "I16",
        torch.int32: "I32",
        torch.int64: "I64",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.float32: "F32",
        torch.float64: "F64",
        torch.float8_e4m3fn: "F8_E4M3",
        torch.float8_e5m2: "F8_E5M2",
    }
    return names[dtype]


def parse_shard_size(text: str | int) -> int:
    """'5GB', '500MB', '10KB' or a byte count -> bytes; InputError when unparsable."""
    from huggingface_hub.serialization._base import parse_size_to_int

    if isinstance(text, int) or str(text).strip().isdigit():
        size = int(text)
    else:
        try:
            size = parse_size_to_int(str(text))
        except ValueError as exc:
            raise InputError(
                f"--max-shard-size {text!r}: not a size; use a byte count or e.g. 5GB, 500MB"
            ) from exc
    if size <= 0:
        raise InputError(f"--max-shard-size {text!r}: must be positive")
    return size


def plan_shards(blobs: list[TensorBlob], max_shard_size: int) -> dict[str, list[TensorBlob]]:
    """File name -> its blobs, in huggingface_hub's sharding and naming."""
    from huggingface_hub.serialization import split_state_dict_into_shards_factory

    by_name = {b.name: b for b in sorted(blobs, key=lambda b: b.name)}
    split = split_state_dict_into_shards_factory(
        by_name,  # type: ignore[arg-type]
        get_storage_size=lambda blob: blob.nbytes,
        filename_pattern=SINGLE_FILE.replace(".safetensors", "{suffix}.safetensors"),
        max_shard_size=max_shard_size,
    )
    return {f: [by_name[n] for n in names] for f, names in split.filename_to_tensors.items()}


def write_checkpoint_weights(
    folder: Path, blobs: list[TensorBlob], max_shard_size: int
) -> list[str]:
    """Write ``blobs`` into ``folder`` as shards (+ index when more than one); return file names."""
    from tqdm.auto import tqdm

    plan = plan_shards(blobs, max_shard_size)
    total = sum(b.nbytes for b in blobs)
    with tqdm(total=total, desc="writing shards", unit="B", unit_scale=True, disable=None) as bar:
        for filename, shard_blobs in plan.items():
            write_safetensors(folder / filename, shard_blobs)
            bar.update(sum(b.nbytes for b in shard_blobs))
    if len(plan) > 1:
        weight_map = {b.name: f for f, shard in plan.items() for b in shard}
        index = {
            "metadata": {"total_size": sum(b.nbytes for b in blobs)},
            "weight_map": dict(sorted(weight_map.items())),
        }
        write_text(folder / INDEX_FILE, json.dumps(index, indent=2) + "\n")
        return [*plan, INDEX_FILE]
    return list(plan)


def write_safetensors(path: Path, blobs: Iterable[TensorBlob]) -> None:
    """Write one safetensors file, streaming file-backed blobs from their source."""
    blobs = list(blobs)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for blob in blobs:
        expected = _numel(blob.shape) * DTYPE_SIZES[blob.dtype]
        if expected != blob.nbytes:
            raise ValueError(f"{blob.name}: {blob.nbytes} bytes for {blob.dtype}{list(blob.shape)}")
        header[blob.name] = {
            "dtype": blob.dtype,
            "shape": list(blob.shape),
            "data_offsets": [offset, offset + blob.nbytes],
        }
        offset += blob.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for blob in blobs:
            if blob.data is not None:
                out.write(blob.data)
            else:
                _copy_range(blob.source, out)  # type: ignore[arg-type]
    os.chmod(path, FILE_MODE)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _copy_range(info: TensorInfo, out) -> None:  # type: ignore[no-untyped-def]
    out.flush()
    with info.file.open("rb") as src:
        remaining, position = info.nbytes, info.start
        while remaining:
            try:
                sent = os.copy_file_range(src.fileno(), out.fileno(), remaining, position)
            except OSError:
                src.seek(position)
                shutil.copyfileobj(_LimitedReader(src, remaining), out, COPY_CHUNK)
                out.flush()
                return
            if sent == 0:
                raise InputError(f"{info.file}: ended early while copying '{info.name}'")
            remaining -= sent
            position += sent
    out.seek(0, os.SEEK_END)


class _LimitedReader:
    def __init__(self, handle, limit: int) -> None:  # type: ignore[no-untyped-def]
        self._handle, self._left = handle, limit

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        data = self._handle.read(size)
        self._left -= len(data)
        return data


def write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    os.chmod(path, FILE_MODE)


def copy_extra_files(src: Path, dst: Path, skip: set[str]) -> list[str]:
    """Copy the non-weight files (tokenizer, generation config, …) from ``src`` to ``dst``."""
    copied = []
    for path in sorted(src.iterdir()):
        name = path.name
        if name in skip or name.endswith(".safetensors") or not path.is_file():
            continue
        if name.startswith(".") or name == INDEX_FILE:
            continue
        if not path.resolve().is_relative_to(src.resolve()):
            continue
        shutil.copyfile(path, dst / name)
        os.chmod(dst / name, FILE_MODE)
        copied.append(name)
    return copied
