"""The draft's vocabulary maps: ``d2t`` (draft token i -> target token i + d2t[i]) and ``t2d``.

vLLM (``llama_eagle3.py``) copies ``d2t`` into its int64 ``draft_id_to_target_id`` as it is
stored, with no check, and skips ``t2d``. A producer that casts the maps to a float (ModelOpt's
``quantize_drafter.py`` casts every tensor it writes to BF16) changes the offsets above 256:
the draft then proposes the wrong target tokens and nothing fails. A float cast cannot be
undone from the draft alone; the draft it was made from holds the exact maps. Read without
torch (``struct`` over the stored bytes); BF16 is float32's upper half, rounded to nearest even.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

from eaglequant.io.checkpoint import Checkpoint
from eaglequant.io.safetensors_header import FLOAT_DTYPES
from eaglequant.rules.draft import Problem

MAPS = ("d2t", "t2d")
# An integer map's safetensors dtype -> its struct code.
INTEGER_DTYPES = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B", "U16": "H", "U32": "I"}
EXPECTED = {"d2t": "an integer map", "t2d": "the boolean target-to-draft mask"}


def restore_hint(folder: Path) -> str:
    return (
        f"restore it from the BF16 draft it was made from: `eaglequant fix-config {folder} "
        "--d2t-from BF16_DRAFT`"
    )


def is_cast(ckpt: Checkpoint, name: str) -> bool:
    """Whether map ``name`` is stored in a dtype other than its own (d2t integer, t2d bool)."""
    info = ckpt.tensors.get(name)
    if info is None:
        return False
    return info.dtype in FLOAT_DTYPES if name == "d2t" else info.dtype != "BOOL"


def vocab_map_problems(ckpt: Checkpoint) -> list[Problem]:
    """``d2t`` an integer map vLLM can use (every draft token to a target token) and ``t2d``
    boolean; a cast map is repaired only from the draft it was made from."""
    problems = []
    for name in MAPS:
        info = ckpt.tensors.get(name)
        if info is None:
            continue
        where = f"{info.file}: tensor '{info.name}'"
        if is_cast(ckpt, name):
            why = (
                ": vLLM copies it into its int64 draft-to-target map as it is, and a float "
                "cast changes the offsets"
                if name == "d2t"
                else ""
            )
            problems.append(
                Problem(
                    where, f"is {info.dtype}, not {EXPECTED[name]}{why}", restore_hint(ckpt.folder)
                )
            )
        elif name == "d2t" and info.dtype in INTEGER_DTYPES:
            bad = _unmapped_draft_token(ckpt)
            if bad is not None:
                problems.append(Problem(where, bad, restore_hint(ckpt.folder)))
    return problems


def read_ints(ckpt: Checkpoint, name: str) -> list[int]:
    """An integer (or boolean) map's values."""
    dtype = ckpt.tensors[name].dtype
    code = "B" if dtype == "BOOL" else INTEGER_DTYPES[dtype]
    raw = ckpt.read_raw(name)
    return list(struct.unpack(f"<{len(raw) // struct.calcsize(code)}{code}", raw))


def read_floats(ckpt: Checkpoint, name: str) -> list[float]:
    """A float tensor's values as stored (a float-cast map, a scale), read without torch."""
    dtype, raw = ckpt.tensors[name].dtype, ckpt.read_raw(name)
    if dtype == "BF16":
        halves = struct.unpack(f"<{len(raw) // 2}H", raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    code = {"F16": "e", "F32": "f", "F64": "d"}[dtype]
    return list(struct.unpack(f"<{len(raw) // struct.calcsize(code)}{code}", raw))


def cast_to(value: int, dtype: str) -> float:
    """``value`` as a ``dtype`` float holds it (round to nearest even)."""
    if dtype == "BF16":
        (bits,) = struct.unpack("<I", struct.pack("<f", float(value)))
        bits += 0x7FFF + ((bits >> 16) & 1)
        return float(struct.unpack("<f", struct.pack("<I", (bits >> 16) << 16))[0])
    code = {"F16": "e", "F32": "f", "F64": "d"}[dtype]
    try:
        return float(struct.unpack(f"<{code}", struct.pack(f"<{code}", float(value)))[0])
    except OverflowError:  # beyond F16's range: the cast made it infinite
        return math.copysign(math.inf, value)


def _unmapped_draft_token(ckpt: Checkpoint) -> str | None:
    """Why the integer d2t cannot be vLLM's map, or None."""
    vocab = ckpt.flat_config.get("vocab_size")
    if not isinstance(vocab, int):
        return None
    for i, offset in enumerate(read_ints(ckpt, "d2t")):
        if not 0 <= i + offset < vocab:
            return (
                f"maps draft token {i} to target token {i + offset}, outside the target's "
                f"vocabulary of {vocab}"
            )
    return None
