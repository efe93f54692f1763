"""NaN/Inf check of one stored tensor, chunk by chunk, from its file or once loaded (torch only)."""

from __future__ import annotations

import math

import torch

from eaglequant.errors import InputError
from eaglequant.io.layout import torch_dtypes
from eaglequant.io.safetensors_header import DTYPE_SIZES, FLOAT_DTYPES, TensorInfo

FINITE_CHECK_BYTES = 64 * 1024 * 1024


def check_finite(info: TensorInfo) -> None:
    """Count NaN/Inf chunk by chunk, read straight from the file (nothing stays in memory)."""
    if info.dtype not in FLOAT_DTYPES:
        return
    dtype = torch_dtypes()[info.dtype]
    step = FINITE_CHECK_BYTES - FINITE_CHECK_BYTES % 8
    bad, buffer = 0, bytearray(min(step, info.nbytes))
    with info.file.open("rb", buffering=0) as handle:
        for offset in range(0, info.nbytes, step):
            size = min(step, info.nbytes - offset)
            handle.seek(info.start + offset)
            if handle.readinto(memoryview(buffer)[:size]) != size:
                raise InputError(f"{info.file}: ended early while reading '{info.name}'")
            count = size // DTYPE_SIZES[info.dtype]
            bad += count_nonfinite(torch.frombuffer(buffer, dtype=dtype, count=count))
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
