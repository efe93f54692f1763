"""How the draft's BF16 GEMMs compute: in BF16, or in float32 from BF16 values.

vLLM runs a BF16 draft's linear layers (``fc``, ``lm_head`` and the midlayer's)
in BF16: BF16 inputs, float32 accumulation, BF16 outputs. Where the CPU has fast
BF16 GEMMs (oneDNN on AVX512-BF16 or AMX) that is the fast way here too. Where
it has none, torch's BF16 GEMMs run at a fraction of the float32 rate
(``torch.mm`` falls back to a scalar loop), so the same values are computed in
float32 from the BF16 values, a cache-sized block of weight rows at a time, and
rounded to BF16 where vLLM's outputs are BF16. The two paths differ only by
float32 summation order, so calibration statistics do not depend on the CPU kind.

The path is chosen once per process: BF16 where oneDNN has BF16 kernels here
and a short probe finds them at least as fast as float32, float32 elsewhere.
:data:`GEMM_ENV` (``bf16`` or ``float32``) forces it; tensors on an accelerator
always compute in their own dtype.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from eaglequant.errors import InputError

GEMM_ENV = "EAGLEQUANT_GEMM"  # auto (default), bf16 or float32
GEMM_PATHS = ("bf16", "float32")
UPCAST_ELEMENTS = 1 << 23  # weight values upcast at a time into one reused 32 MiB buffer
VIEW_ELEMENTS = 1 << 26  # weight values per GEMM in the weight's own dtype (BF16 GEMMs want many)
MICRO_BATCH_TOKENS = 512  # tokens per unrolled forward in calibration and measurement
PROBE_SHAPE = (512, 4096, 1024)  # tokens (a micro-batch), inputs, outputs: 4.3 GFLOP
_TAKEN: set[str] = set()  # the paths this process's BF16 GEMMs on the CPU took


def cpu_gemm_path() -> str:
    """``bf16`` or ``float32``: how BF16 weights compute on this CPU (:data:`GEMM_ENV` forces)."""
    forced = os.environ.get(GEMM_ENV, "auto")
    if forced in GEMM_PATHS:
        return forced
    if forced != "auto":
        raise InputError(f"{GEMM_ENV}={forced!r}: use auto, bf16 or float32")
    return _probed_path()


@functools.cache
def _probed_path() -> str:
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "float32"  # torch's own BF16 GEMMs: a fraction of the float32 rate
    rates = probe_rates()
    return "bf16" if rates["bf16"] >= rates["float32"] else "float32"


def probe_rates(repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of one BF16 and one float32 (weights upcast from BF16) GEMM, best of ``repeats``."""
    tokens, inputs, outputs = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, inputs, generator=generator).bfloat16()
    weight = torch.randn(outputs, inputs, generator=generator).bfloat16()
    runs: dict[str, Callable[[], torch.Tensor]] = {
        "bf16": lambda: F.linear(x, weight),
        "float32": lambda: upcast_linear(x.float(), weight),
    }
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats + 1):  # the first round warms up
        for path, run in runs.items():
            started = time.perf_counter()
            run()
            best[path] = min(best[path], time.perf_counter() - started)
    return {path: 2 * tokens * inputs * outputs / seconds / 1e9 for path, seconds in best.items()}


def native(weight: torch.Tensor) -> bool:
    """Whether a GEMM with ``weight`` runs in ``weight``'s own dtype (else float32 from it)."""
    return runs_natively(weight.dtype, weight.device)


def runs_natively(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether GEMMs in ``dtype`` run in ``dtype`` on ``device`` (else float32 from it).

    On the CPU only BF16 may (FP16 GEMMs are slow without AVX512-FP16 or AMX).
    """
    if dtype == torch.float32 or device.type != "cpu":
        return True
    path = cpu_gemm_path() if dtype == torch.bfloat16 else "float32"
    _TAKEN.add(path)
    return path == "bf16"


def paths_taken() -> list[str]:
    """The paths low-precision GEMMs on the CPU took in this process so far (for the manifest)."""
    return sorted(_TAKEN)


def row_blocks(weight: torch.Tensor, elements: int) -> list[slice]:
    """Slices of ``weight``'s rows, ``elements`` values each (at least one row)."""
    rows = max(1, elements // max(weight.shape[1], 1))
    return [slice(start, start + rows) for start in range(0, weight.shape[0], rows)]


def micro_batches(sequences: int, length: int) -> list[slice]:
    """Row slices of at most :data:`MICRO_BATCH_TOKENS` tokens (at least one sequence)."""
    per = max(1, MICRO_BATCH_TOKENS // max(length, 1))
    return [slice(i, i + per) for i in range(0, sequences, per)]


def weight_blocks(weight: torch.Tensor, dtype: torch.dtype) -> Iterator[tuple[slice, torch.Tensor]]:
    """``weight``'s row blocks in ``dtype``: views in its own dtype, else copies into one buffer.

    A full-size weight is never held a second time at a higher precision.
    """
    if dtype == weight.dtype:
        yield from ((rows, weight[rows]) for rows in row_blocks(weight, VIEW_ELEMENTS))
        return
    blocks = row_blocks(weight, UPCAST_ELEMENTS)
    buffer = weight.new_empty(blocks[0].stop - blocks[0].start, weight.shape[1], dtype=dtype)
    for rows in blocks:
        block = weight[rows]
        yield rows, buffer[: block.shape[0]].copy_(block)


def upcast_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` in ``x``'s dtype, a block of weight rows at a time."""
    out = x.new_empty(*x.shape[:-1], weight.shape[0])
    for rows, block in weight_blocks(weight, x.dtype):
        out[..., rows] = F.linear(x, block, None if bias is None else bias[rows].to(x.dtype))
    return out


def round_as(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` rounded to ``dtype`` (what vLLM's BF16 GEMM outputs), as float32."""
    return values.to(dtype).float()


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` with BF16 in and out as vLLM computes it; float32 values.

    ``x`` is rounded to ``weight``'s dtype and so is the output, on either path.
    """
    x = x.to(weight.dtype)
    if native(weight):
        return F.linear(x, weight).float()
    return round_as(upcast_linear(x.float(), weight), weight.dtype)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The GEMM of FP8 ``x`` and FP8 ``weight``, its sums rounded to BF16; float32 values.

    In BF16 where BF16 GEMMs are native (FP8 values are exact in BF16; the sums
    are rounded to BF16 as such a GEMM returns them), else in float32, rounded
    the same. The weight holds FP8 values in FP8 or in BF16; where that is not the GEMM's
    dtype it is converted a block of rows at a time.
    """
    dtype = torch.bfloat16 if runs_natively(torch.bfloat16, weight.device) else torch.float32
    return round_as(upcast_linear(x.to(dtype), weight), torch.bfloat16)


def module_linear(module: nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``module(x)`` as vLLM computes a linear layer of a ``dtype`` model; float32 values.

    The input and the output are rounded to ``dtype``. The input goes in as
    ``dtype`` itself where the module's weight is ``dtype`` and native here (the
    GEMM runs in ``dtype``), else as float32 holding ``dtype`` values (the module
    computes in float32). ``dtype`` None: the module as it is, in float32.
    """
    if dtype is None:
        return module(x)
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    if weight.dtype == dtype and native(weight):
        return round_as(module(x.to(dtype)), dtype)
    return round_as(module(round_as(x, dtype)), dtype)


def top1(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``linear(x, weight).argmax(-1)``, one block of weight rows at a time.

    The full output (tokens x vocabulary) is never held. Ties go to the first
    index, as ``argmax`` does: a block's maximum replaces the best only when larger.
    """
    rows_in = x.reshape(-1, x.shape[-1]).to(weight.dtype)
    if not native(weight):
        rows_in = rows_in.float()
    best = torch.full((rows_in.shape[0],), -torch.inf, device=x.device)
    index = torch.zeros(rows_in.shape[0], dtype=torch.long, device=x.device)
    for rows, block in weight_blocks(weight, rows_in.dtype):
        value, where = round_as(F.linear(rows_in, block), weight.dtype).max(-1)
        better = value > best
        best = torch.where(better, value, best)
        index = torch.where(better, where + rows.start, index)
    return index.reshape(x.shape[:-1])
