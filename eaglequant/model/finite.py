"""NaN/Inf check of one stored tensor: chunk by chunk from its file (numpy), or once loaded."""

from __future__ import annotations

import math

import numpy as np
import torch

from eaglequant.errors import InputError
from eaglequant.io.safetensors_header import DTYPE_SIZES, FLOAT_DTYPES, TensorInfo

FINITE_CHECK_BYTES = 64 * 1024 * 1024
# Each float dtype's exponent bits (as its unsigned integer): NaN or Inf exactly when all set.
EXPONENT_BITS: dict[str, tuple[type[np.unsignedinteger], int]] = {
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
    "F32": (np.uint32, 0x7F800000),
    "F64": (np.uint64, 0x7FF0000000000000),
}


def check_finite(info: TensorInfo) -> None:
    """Count NaN/Inf chunk by chunk, read straight from the file (nothing stays in memory).

    On the bit patterns with numpy, in the calling thread alone: about 3x the rate
    of torch's two-thread ``abs().max()`` here, and it runs beside Quark's worker
    without an OpenMP team waiting for a core that Quark holds.
    """
    if info.dtype not in FLOAT_DTYPES:
        return
    bits, mask = EXPONENT_BITS[info.dtype]
    step = FINITE_CHECK_BYTES - FINITE_CHECK_BYTES % 8
    bad, buffer = 0, bytearray(min(step, info.nbytes))
    with info.file.open("rb", buffering=0) as handle:
        for offset in range(0, info.nbytes, step):
            size = min(step, info.nbytes - offset)
            handle.seek(info.start + offset)
            if handle.readinto(memoryview(buffer)[:size]) != size:
                raise InputError(f"{info.file}: ended early while reading '{info.name}'")
            values = np.frombuffer(buffer, dtype=bits, count=size // DTYPE_SIZES[info.dtype])
            bad += int(np.count_nonzero((values & mask) == mask))
    _raise_if_bad(info, bad)


def require_finite(info: TensorInfo, tensor: torch.Tensor) -> None:
    """The same check on a tensor already loaded from ``info``."""
    step = FINITE_CHECK_BYTES // max(tensor.element_size(), 1)
    _raise_if_bad(info, sum(count_nonfinite(c) for c in tensor.reshape(-1).split(step)))


def count_nonfinite(values: torch.Tensor) -> int:
    """NaN/Inf count of a 1-D chunk.

    ``abs().max()`` propagates NaN and Inf and runs ~7x faster than ``isfinite``
    on BF16 here; the exact count is only taken for a chunk that fails it.
    """
    if not values.numel() or math.isfinite(float(values.abs().max())):
        return 0
    return int((~torch.isfinite(values)).sum())


def _raise_if_bad(info: TensorInfo, bad: int) -> None:
    if bad:
        raise InputError(
            f"{info.file}: tensor '{info.name}' holds {bad} NaN/Inf value(s); "
            "the checkpoint is corrupt, re-export it from a healthy training run"
        )
