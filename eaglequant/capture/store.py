"""The capture folder: its format, its tensor file written row by row, and reading it back.

A capture folder (``eaglequant capture``, export's calibration, validate's check 6) holds

* ``hidden_states.safetensors``: ``input_ids`` int64 [N, T]; ``aux_hidden_states``
  BF16 [N, T, num_aux * target_hidden] (the auxiliary layers concatenated in
  ascending layer order, as vLLM feeds them to ``fc``); optional
  ``embed_tokens.weight`` (copied byte for byte from the target's safetensors);
  optional ``lengths`` int64 [N] when sequences differ in length (each row is
  then valid up to its length, zero after it);
* ``capture.json``: the format name, the layer ids, the target's sizes, the
  engine that produced it (name, parallelism, vLLM version) and timings.

The tensor file is planned whole before any state exists (every offset is known
from N, T and the width), so engines write each sequence's row in place as it
finishes: memory stays one row however many sequences are captured, and several
engine processes (data parallel replicas) can fill disjoint rows of one file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from eaglequant.capture.records import CaptureInfo
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.layout import TensorBlob, blob_from_tensor, plan_file
from eaglequant.io.safetensors_header import DTYPE_SIZES, TensorInfo, read_header
from eaglequant.io.writer import FILE_MODE, pwrite_all, write_known_file, write_text
from eaglequant.results.manifest import read_json_object
from eaglequant.rules.draft import DraftDims

if TYPE_CHECKING:
    import torch

CAPTURE_TENSORS = "hidden_states.safetensors"
CAPTURE_INFO = "capture.json"
CAPTURE_FORMAT = "eaglequant-capture-v1"
EMBED = "embed_tokens.weight"


@dataclass
class CalibrationData:
    """Token ids [N, T] and auxiliary hidden states [N, T, fc_in]; ``lengths`` when ragged."""

    input_ids: torch.Tensor
    aux_hidden: torch.Tensor
    source: str
    embed_tokens: torch.Tensor | None = None
    lengths: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        if self.lengths is not None:
            return int(self.lengths.sum())
        return int(self.input_ids.numel())

    def split(self, samples: int, held_out: int) -> tuple[CalibrationData, CalibrationData]:
        """Calibration and held-out parts (held-out shrinks when there is too little data)."""
        total = len(self.input_ids)
        held = min(held_out, max(total - 1, 0) // 2)
        calib = min(samples, total - held)
        return self._rows(slice(0, calib)), self._rows(slice(total - held, total))

    def _rows(self, rows: slice) -> CalibrationData:
        lengths = self.lengths[rows] if self.lengths is not None else None
        return CalibrationData(
            self.input_ids[rows], self.aux_hidden[rows], self.source, self.embed_tokens, lengths
        )

    def batches(self, batch_size: int) -> list[dict[str, torch.Tensor]]:
        """Draft inputs: aux states at positions 0..T-2 with the tokens at 1..T-1.

        Sequences of different lengths go one per batch, cut to their length.
        """
        if self.lengths is not None:
            return [
                {
                    "aux_hidden": self.aux_hidden[i : i + 1, : n - 1],
                    "next_ids": self.input_ids[i : i + 1, 1:n],
                }
                for i, n in enumerate(self.lengths.tolist())
            ]
        return [
            {
                "aux_hidden": self.aux_hidden[i : i + batch_size, :-1],
                "next_ids": self.input_ids[i : i + batch_size, 1:],
            }
            for i in range(0, len(self.input_ids), batch_size)
        ]


def sequences_tensor(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token id rows padded to the longest (with 0), and their lengths when they differ."""
    # lazy: torch-free core
    import torch

    longest = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), longest), dtype=torch.int64)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.int64)
    if all(len(s) == longest for s in sequences):
        return ids, None
    return ids, torch.tensor([len(s) for s in sequences], dtype=torch.int64)


class CaptureFile:
    """``hidden_states.safetensors`` being filled: ids known, each aux row written in place."""

    def __init__(self, path: Path, aux: TensorInfo) -> None:
        self.path, self.aux = path, aux
        self.rows, self.seq_len, self.width = aux.shape
        self.row_bytes = self.seq_len * self.width * DTYPE_SIZES[aux.dtype]

    @classmethod
    def create(
        cls,
        path: Path,
        sequences: list[list[int]],
        width: int,
        embed: TensorBlob | None = None,
    ) -> CaptureFile:
        """Plan and write the file: header, ids, lengths and embeddings; aux rows left zero."""
        ids, lengths = sequences_tensor(sequences)
        blobs = [blob_from_tensor("input_ids", ids)]
        if lengths is not None:
            blobs.append(blob_from_tensor("lengths", lengths))
        aux_shape = (len(sequences), ids.shape[1], width)
        blobs.append(TensorBlob("aux_hidden_states", "BF16", aux_shape))
        if embed is not None:
            blobs.append(embed)
        shard = plan_file(path.name, blobs)
        write_known_file(path, shard)
        _reserve(path, shard.size)
        return cls.open(path)

    @classmethod
    def open(cls, path: Path) -> CaptureFile:
        """An existing capture file (an engine process filling its share of the rows)."""
        return cls(path, read_header(path).tensors["aux_hidden_states"])

    def sequences(self) -> list[list[int]]:
        """The token ids of every row, cut to their lengths."""
        # lazy: torch-free core
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as handle:
            ids = handle.get_tensor("input_ids")
            names = set(handle.keys())
            lengths = handle.get_tensor("lengths").tolist() if "lengths" in names else None
        rows = ids.tolist()
        return [r[: lengths[i]] for i, r in enumerate(rows)] if lengths else rows

    def write_row(self, row: int, states: torch.Tensor) -> None:
        """Row ``row``'s states [tokens, width] (tokens <= T), stored as BF16 in place."""
        if states.dim() != 2 or states.shape[1] != self.width or states.shape[0] > self.seq_len:
            raise ValueError(
                f"row {row}: states of shape {list(states.shape)} do not fit "
                f"[{self.seq_len}, {self.width}]"
            )
        # lazy: torch-free core
        import torch

        data = states.to(torch.bfloat16).contiguous().view(torch.uint8).numpy().tobytes()
        fd = os.open(self.path, os.O_WRONLY)
        try:
            pwrite_all(fd, data, self.aux.start + row * self.row_bytes)
        finally:
            os.close(fd)


def _reserve(path: Path, size: int) -> None:
    """Allocate the whole file now, so a full disk fails here, before any engine starts."""
    fd = os.open(path, os.O_WRONLY)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def write_info(folder: Path, info: CaptureInfo) -> CaptureInfo:
    """``capture.json`` (its format name first); returns what was written."""
    _write_json(folder, info)
    return info


def _write_json(folder: Path, info: Mapping[str, object]) -> None:
    write_text(folder / CAPTURE_INFO, json.dumps(info, indent=2) + "\n")
    os.chmod(folder / CAPTURE_TENSORS, FILE_MODE)


def read_info(folder: Path) -> CaptureInfo | None:
    """``capture.json`` of a capture folder (None when absent: a bare tensor file)."""
    path = folder / CAPTURE_INFO
    return cast(CaptureInfo, read_json_object(path, "capture info")) if path.is_file() else None


def save_capture(folder: Path, data: CalibrationData, info: dict[str, Any]) -> None:
    """Write a capture folder from states held in memory (small captures, tests, benches);
    ``capture.json`` holds the format, the tokens and the caller's ``info``."""
    lengths = data.lengths.tolist() if data.lengths is not None else None
    rows = data.input_ids.tolist()
    sequences = [r[: lengths[i]] for i, r in enumerate(rows)] if lengths else rows
    embed = None
    if data.embed_tokens is not None:
        embed = blob_from_tensor(EMBED, data.embed_tokens.bfloat16())
    file = CaptureFile.create(folder / CAPTURE_TENSORS, sequences, data.aux_hidden.shape[-1], embed)
    for row, seq in enumerate(sequences):
        file.write_row(row, data.aux_hidden[row, : len(seq)])
    _write_json(folder, {"format": CAPTURE_FORMAT, "tokens": data.tokens, **info})


def target_embeddings(target: Path) -> TensorBlob:
    """The target's input embeddings, copied byte for byte from its safetensors (never loaded)."""
    tensors = read_checkpoint(target).tensors
    found = sorted(n for n in tensors if n.endswith(EMBED))
    language = [n for n in found if "vision" not in n and "audio" not in n]
    if not language:
        raise InputError(
            f"{target}: no '*embed_tokens.weight' tensor in the target's safetensors; "
            "capture without embeddings and give the draft its own embed_tokens"
        )
    info = tensors[language[0]]
    return TensorBlob(EMBED, info.dtype, info.shape, source=info)


def check_capture(folder: Path, dims: DraftDims) -> Path:
    """The capture's tensor file, its header checked against the draft (reads no tensor)."""
    path = folder / CAPTURE_TENSORS if folder.is_dir() else folder
    if not path.is_file():
        raise InputError(f"{path}: no such capture file; run `eaglequant capture` first")
    header = read_header(path)
    for name in ("input_ids", "aux_hidden_states"):
        if name not in header.tensors:
            raise InputError(f"{path}: tensor '{name}' is missing; re-run `eaglequant capture`")
    ids_info, aux_info = header.tensors["input_ids"], header.tensors["aux_hidden_states"]
    if len(aux_info.shape) != 3 or aux_info.shape[-1] != dims.fc_in:
        raise InputError(
            f"{path}: tensor 'aux_hidden_states' has shape {list(aux_info.shape)}, the draft's fc "
            f"takes width {dims.fc_in}; capture from the target this draft was trained for"
        )
    if ids_info.shape != aux_info.shape[:2]:
        raise InputError(f"{path}: 'input_ids' {list(ids_info.shape)} does not match the states")
    return path


def load_capture(folder: Path, dims: DraftDims) -> CalibrationData:
    """Read a capture folder and check it fits the draft."""
    # lazy: torch-free core
    from safetensors import safe_open

    path = check_capture(folder, dims)
    with safe_open(str(path), framework="pt") as handle:
        names = set(handle.keys())
        ids = handle.get_tensor("input_ids").long()
        aux = handle.get_tensor("aux_hidden_states")
        embed = handle.get_tensor(EMBED) if EMBED in names else None
        lengths = handle.get_tensor("lengths").long() if "lengths" in names else None
    if int(ids.max()) >= dims.vocab or int(ids.min()) < 0:
        raise InputError(f"{path}: token ids exceed the draft's vocab_size {dims.vocab}")
    if lengths is not None and (lengths.shape != ids.shape[:1] or int(lengths.min()) < 2):
        raise InputError(f"{path}: tensor 'lengths' does not describe the rows; re-run capture")
    return CalibrationData(ids, aux, f"capture {path}", embed, lengths)
