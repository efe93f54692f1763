"""Writing safetensors checkpoints: sharding, index, and streamed pass-through tensors.

Tensors are written as blobs: bytes in memory (a quantized weight), a byte
range of an input file (a tensor passed through unchanged, copied by the kernel
without being decoded, so ``fc``/``lm_head``/``embed_tokens`` stay
byte-identical and are never held in memory), or *pending*: a tensor whose
dtype and shape are known but whose bytes come later.

The layout is planned first (huggingface_hub's ``split_state_dict_into_shards_factory``:
HF file names, ``{"format": "pt"}`` metadata, ``model.safetensors.index.json``
with ``total_size``), so every tensor's place in every file is known before any
byte is written. That lets the export copy the pass-through gigabytes in a
background thread while Quark is still working, then drop the quantized bytes
into their places (:class:`LayoutWriter`).
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eaglequant.checkpoint import INDEX_FILE, SINGLE_FILE
from eaglequant.errors import InputError
from eaglequant.safetensors_header import DTYPE_SIZES, TensorInfo

if TYPE_CHECKING:
    import torch

FILE_MODE = 0o644
COPY_CHUNK = 256 * 1024 * 1024
DEFAULT_MAX_SHARD_SIZE = "5GB"


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
    files = tuple(_plan_file(name, shard_blobs) for name, shard_blobs in shards.items())
    index = None
    if len(files) > 1:
        weight_map = {p.blob.name: f.name for f in files for p in f.placements}
        index_json = {
            "metadata": {"total_size": sum(b.nbytes for b in blobs)},
            "weight_map": dict(sorted(weight_map.items())),
        }
        index = json.dumps(index_json, indent=2) + "\n"
    return Layout(files, index)


def _plan_file(name: str, blobs: list[TensorBlob]) -> ShardFile:
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


def write_checkpoint_weights(
    folder: Path, blobs: list[TensorBlob], max_shard_size: int
) -> list[str]:
    """Write ``blobs`` into ``folder`` as shards (+ index when more than one); return file names."""
    writer = LayoutWriter(folder, plan_layout(blobs, max_shard_size))
    writer.write_known()
    writer.finish({}, durable=False)
    return writer.layout.file_names


def write_safetensors(path: Path, blobs: Iterable[TensorBlob]) -> None:
    """Write one safetensors file, streaming file-backed blobs from their source."""
    shard = _plan_file(path.name, list(blobs))
    _write_known(path.parent, shard, threading.Event())
    os.chmod(path, FILE_MODE)


class LayoutWriter:
    """Writes a planned layout: known bytes first (optionally in the background), pending later.

    ``start_background()`` copies every pass-through and in-memory tensor into
    place in a thread (the kernel copies; the GIL is free for other work);
    ``finish(pending)`` waits for it, writes the pending tensors' bytes at their
    planned offsets, the index, sets modes and fsyncs. Errors of the background
    thread are raised from ``finish``; ``cancel()`` stops it (between chunks).
    ``check_source(info)`` runs on each pass-through tensor right after its copy,
    while its bytes are still in the page cache (the export checks for NaN/Inf).
    """

    def __init__(
        self,
        folder: Path,
        layout: Layout,
        check_source: Callable[[TensorInfo], None] | None = None,
    ) -> None:
        self.folder, self.layout = folder, layout
        self.check_source = check_source
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.background_s = 0.0

    def start_background(self) -> None:
        self._thread = threading.Thread(target=self._run, name="eaglequant-writer", daemon=True)
        self._thread.start()

    def write_known(self) -> None:
        for shard in self.layout.files:
            _write_known(self.folder, shard, self._cancel)
            if self.check_source is None:
                continue
            for placed in shard.placements:
                if placed.blob.source is not None and not self._cancel.is_set():
                    self.check_source(placed.blob.source)

    def _run(self) -> None:
        import time

        started = time.perf_counter()
        try:
            self.write_known()
        except BaseException as exc:  # re-raised in the caller's thread by wait()
            self._error = exc
        self.background_s = time.perf_counter() - started

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def cancel(self) -> None:
        self._cancel.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def finish(self, pending: dict[str, bytes], durable: bool = True) -> None:
        """Write the pending tensors' bytes, the index and file modes; fsync when ``durable``."""
        self.wait()
        planned = {
            p.blob.name: p.blob.nbytes
            for f in self.layout.files
            for p in f.placements
            if p.blob.pending
        }
        sizes = {name: len(data) for name, data in pending.items()}
        if sizes != planned:
            raise ValueError(f"pending tensors planned as {planned}, given {sizes}")
        for name, data in pending.items():
            shard, placed = self.layout.placement(name)
            with (self.folder / shard.name).open("r+b") as out:
                _pwrite_all(out.fileno(), data, placed.start)
        if self.layout.index is not None:
            write_text(self.folder / INDEX_FILE, self.layout.index)
        for shard in self.layout.files:
            path = self.folder / shard.name
            os.chmod(path, FILE_MODE)
            if durable:
                _fsync(path)


def _write_known(folder: Path, shard: ShardFile, cancel: threading.Event) -> None:
    with (folder / shard.name).open("wb") as out:
        out.truncate(shard.size)
        _pwrite_all(out.fileno(), shard.header, 0)
        for placed in shard.placements:
            if cancel.is_set():
                return
            if placed.blob.data is not None:
                if len(placed.blob.data) != placed.blob.nbytes:
                    raise ValueError(
                        f"{placed.blob.name}: {len(placed.blob.data)} bytes for "
                        f"{placed.blob.dtype}{list(placed.blob.shape)}"
                    )
                _pwrite_all(out.fileno(), placed.blob.data, placed.start)
            elif placed.blob.source is not None:
                _copy_range(placed.blob.source, out.fileno(), placed.start, cancel)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _copy_range(info: TensorInfo, out_fd: int, out_offset: int, cancel: threading.Event) -> None:
    """Copy ``info``'s bytes to ``out_offset`` in the kernel (plain reads if it can't)."""
    with info.file.open("rb") as src:
        done = 0
        while done < info.nbytes and not cancel.is_set():
            count = min(COPY_CHUNK, info.nbytes - done)
            try:
                sent = os.copy_file_range(
                    src.fileno(), out_fd, count, info.start + done, out_offset + done
                )
            except OSError:  # another file system, an old kernel: copy through memory
                chunk = os.pread(src.fileno(), count, info.start + done)
                sent = len(chunk)
                _pwrite_all(out_fd, chunk, out_offset + done)
            if sent == 0:
                raise InputError(f"{info.file}: ended early while copying '{info.name}'")
            done += sent


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    os.chmod(path, FILE_MODE)


def copy_extra_files(src: Path, dst: Path, skip: set[str]) -> list[str]:
    """Copy the non-weight files (tokenizer, generation config, …) from ``src`` to ``dst``."""
    import shutil

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
