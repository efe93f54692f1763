"""Shard planning, pure: every output tensor's file and byte range before any byte is written.

Tensors are blobs: bytes in memory (a quantized weight), a byte range of an
input file (a tensor passed through unchanged, so ``fc``/``lm_head``/
``embed_tokens`` stay byte-identical and are never held in memory), or
*pending*: a tensor whose dtype and shape are known but whose bytes come later.
The layout follows huggingface_hub's ``split_state_dict_into_shards_factory``
(HF file names, ``{"format": "pt"}`` metadata, ``model.safetensors.index.json``
with ``total_size``).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eaglequant.io.checkpoint import INDEX_FILE, SINGLE_FILE
from eaglequant.io.safetensors_header import DTYPE_SIZES, TensorInfo

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorBlob:
    """One tensor to write: dtype, shape, and in-memory bytes, an input byte range, or neither."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes | None = None
    source: TensorInfo | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]

    @property
    def pending(self) -> bool:
        return self.data is None and self.source is None


def blob_from_file(info: TensorInfo, name: str | None = None) -> TensorBlob:
    """A tensor copied byte for byte from its input file (stored as ``name`` if given)."""
    return TensorBlob(name or info.name, info.dtype, info.shape, source=info)


def blob_from_tensor(name: str, tensor: torch.Tensor) -> TensorBlob:
    """A tensor held in memory, stored in its own dtype."""
    # lazy: torch-free core
    import torch

    dtype = torch_to_safetensors_dtype(tensor.dtype)
    flat = tensor.detach().contiguous().cpu().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return TensorBlob(name, dtype, tuple(tensor.shape), data=data)


def torch_dtypes() -> dict[str, torch.dtype]:
    """safetensors dtype name -> torch dtype, for the dtypes this tool reads and writes."""
    # lazy: torch-free core
    import torch

    return {
        "BOOL": torch.bool,
        "U8": torch.uint8,
        "I8": torch.int8,
        "I16": torch.int16,
        "I32": torch.int32,
        "I64": torch.int64,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "F32": torch.float32,
        "F64": torch.float64,
        "F8_E4M3": torch.float8_e4m3fn,
        "F8_E5M2": torch.float8_e5m2,
    }


def torch_to_safetensors_dtype(dtype: torch.dtype) -> str:
    return next(name for name, known in torch_dtypes().items() if known == dtype)


@dataclass(frozen=True)
class Placement:
    """One tensor's absolute byte range in its output file."""

    blob: TensorBlob
    start: int

    @property
    def end(self) -> int:
        return self.start + self.blob.nbytes


@dataclass(frozen=True)
class ShardFile:
    """One planned safetensors file: its header bytes and where each tensor goes."""

    name: str
    header: bytes  # the 8-byte length, the JSON header and its padding
    placements: tuple[Placement, ...]

    @property
    def size(self) -> int:
        return self.placements[-1].end if self.placements else len(self.header)


@dataclass(frozen=True)
class Layout:
    """Every output weight file, planned; ``index`` is the index JSON when sharded."""

    files: tuple[ShardFile, ...]
    index: str | None

    @property
    def file_names(self) -> list[str]:
        return [f.name for f in self.files] + ([INDEX_FILE] if self.index else [])

    def placement(self, name: str) -> tuple[ShardFile, Placement]:
        for shard in self.files:
            for placed in shard.placements:
                if placed.blob.name == name:
                    return shard, placed
        raise KeyError(name)


def plan_shards(blobs: list[TensorBlob], max_shard_size: int) -> dict[str, list[TensorBlob]]:
    """File name -> its blobs, in huggingface_hub's sharding and naming."""
    # lazy: torch-free core
    from huggingface_hub.serialization import split_state_dict_into_shards_factory

    by_name = {b.name: b for b in sorted(blobs, key=lambda b: b.name)}
    split = split_state_dict_into_shards_factory(
        by_name,  # type: ignore[arg-type]
        get_storage_size=lambda blob: blob.nbytes,
        filename_pattern=SINGLE_FILE.replace(".safetensors", "{suffix}.safetensors"),
        max_shard_size=max_shard_size,
    )
    return {f: [by_name[n] for n in names] for f, names in split.filename_to_tensors.items()}


def plan_layout(blobs: list[TensorBlob], max_shard_size: int) -> Layout:
    """Shards, headers and every tensor's offset, before any byte is written."""
    shards = plan_shards(blobs, max_shard_size)
    files = tuple(plan_file(name, shard_blobs) for name, shard_blobs in shards.items())
    index = None
    if len(files) > 1:
        weight_map = {p.blob.name: f.name for f in files for p in f.placements}
        index_json = {
            "metadata": {"total_size": sum(b.nbytes for b in blobs)},
            "weight_map": dict(sorted(weight_map.items())),
        }
        index = json.dumps(index_json, indent=2) + "\n"
    return Layout(files, index)


def plan_file(name: str, blobs: list[TensorBlob]) -> ShardFile:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for blob in blobs:
        header[blob.name] = {
            "dtype": blob.dtype,
            "shape": list(blob.shape),
            "data_offsets": [offset, offset + blob.nbytes],
        }
        offset += blob.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    head = struct.pack("<Q", len(raw)) + raw
    placements, position = [], len(head)
    for blob in blobs:
        placements.append(Placement(blob, position))
        position += blob.nbytes
    return ShardFile(name, head, tuple(placements))
