"""Measure an FP8 export against its BF16 source on held-out draft inputs.

The FP8 side is simulated from the written tensors themselves (inputs cast to
FP8 with ``input_scale`` or per-token / per-tensor dynamic scales, a GEMM of the
FP8 values, then both scales), so what is measured is the artifact, not Quark's
in-memory model; OCP MX layers dequantize their weights and QDQ their inputs
per 32-element block, as vLLM emulates them without MX hardware. Both drafts
compute their linears as vLLM's BF16 ones (inputs
and outputs rounded to BF16, :func:`compute.module_linear`); the FP8 GEMM
(:func:`compute.fp8_linear`) rounds its sums to BF16 before the scales apply,
as a BF16 GEMM returns them (vLLM rounds once, after: this is at most one BF16
unit in the last place off).

Reported per quantized layer: the weight amax, the scales,
the input range a static scale covers (``input_scale`` x 448: the amax Quark
observed while calibrating), output SQNR (dB) against the unquantized layer on
the same inputs; and per speculative step, top-1 agreement of the FP8 and BF16
drafts.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn
from tqdm.auto import tqdm

from eaglequant.model import compute, mx
from eaglequant.recipe import FP8_E4M3_MAX, MX_DTYPES, Recipe

if TYPE_CHECKING:  # the draft module's transformers is imported by the flow that builds one
    from eaglequant.model.eagle3 import Eagle3Draft, StepOutput

FP8 = torch.float8_e4m3fn


def fp8_values(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` / ``scale`` (broadcast) in FP8, saturating at ±448."""
    return (x / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8)


class SimulatedFp8Linear(nn.Module):
    """An nn.Linear replacement computing with the exported FP8 tensors.

    Where BF16 GEMMs are native the FP8 weight is converted to BF16 once, here (FP8
    values are exact in BF16): torch converts FP8 at 0.15-0.3 G values/s on a CPU, twice
    a block's GEMM time, which per call would recur for every micro-batch and step. Elsewhere
    (float32 GEMMs) the weight stays FP8, one byte per value, and is upcast a block at a
    time per call: a float32 copy of a full-size midlayer would be 4 bytes per value.
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        input_scale: torch.Tensor | None,
        per_token: bool,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        scale = weight_scale.float()
        if compute.runs_natively(torch.bfloat16, weight.device):
            weight = weight.to(torch.bfloat16)
        self.register_buffer("weight", weight)
        self.bias = None if bias is None else bias.float()
        self.register_buffer("weight_scale", scale.reshape(-1) if scale.numel() > 1 else scale)
        self.input_scale = input_scale.float() if input_scale is not None else None
        self.per_token = per_token

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()  # BF16 where BF16 GEMMs are native: scales and divisions in float32
        if self.input_scale is not None:
            scale = self.input_scale
        elif self.per_token:
            scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / FP8_E4M3_MAX
        else:
            scale = x.abs().amax().clamp_min(1e-12) / FP8_E4M3_MAX
        out = compute.fp8_linear(fp8_values(x, scale), self.weight) * (scale * self.weight_scale)
        return out if self.bias is None else out + self.bias


class SimulatedMxLinear(nn.Module):
    """An nn.Linear replacement computing as vLLM emulates OCP MX where the platform has none.

    The weight is dequantized once from its elements and E8M0 block scales into
    BF16 (exact: every MXFP8/MXFP4 value times a power of two is a BF16 value);
    inputs go through MX QDQ per 32-element block, or FP8 with a static
    ``input_scale`` (W4A8), before a BF16 GEMM.
    """

    weight: torch.Tensor

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        input_scale: torch.Tensor | None,
        recipe: Recipe,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        dequantized = mx.dequantize(weight, weight_scale, recipe.weight.dtype)
        self.register_buffer("weight", dequantized.to(torch.bfloat16))
        self.bias = None if bias is None else bias.float()
        self.input_scale = input_scale.float() if input_scale is not None else None
        self.input_dtype = recipe.activation.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        if self.input_scale is not None:
            x = fp8_values(x, self.input_scale).float() * self.input_scale
        elif self.input_dtype in MX_DTYPES:
            x = mx.quantize_dequantize(x, self.input_dtype)
        out = compute.linear(x, self.weight)
        return out if self.bias is None else out + self.bias


def simulated_fp8_draft(
    bf16: Eagle3Draft, tensors: dict[str, torch.Tensor], recipe: Recipe
) -> Eagle3Draft:
    """A copy of ``bf16`` whose decoder-layer linears compute with the FP8 tensors.

    Every other parameter is shared with ``bf16``, not copied.
    """
    shared = {id(p): p for p in [*bf16.parameters(), *bf16.buffers()]}
    model = copy.deepcopy(bf16, memo=shared)
    for name in bf16.dims.linears:
        parent, child = name.rsplit(".", 1)
        bias = getattr(bf16.get_submodule(name), "bias", None)
        weight, scale = tensors[f"{name}.weight"], tensors[f"{name}.weight_scale"]
        input_scale = tensors.get(f"{name}.input_scale")
        module: nn.Module
        if recipe.mx_weights:
            module = SimulatedMxLinear(weight, scale, input_scale, recipe, bias=bias)
        else:
            per_token = recipe.activation.granularity == "per_token"
            module = SimulatedFp8Linear(weight, scale, input_scale, per_token, bias=bias)
        setattr(model.get_submodule(parent), child, module)
    return model


@dataclass
class LayerStats:
    """One quantized layer's ranges, scales and output SQNR."""

    name: str
    weight_amax: float
    weight_scale: float
    input_amax: float | None
    input_scale: float | None
    sqnr_db: float | None = None


@dataclass
class Measurement:
    """Per-layer stats and per-step top-1 agreement on held-out batches."""

    layers: list[LayerStats]
    top1_agreement: list[float] = field(default_factory=list)
    held_out_tokens: int = 0


def measure(
    bf16: Eagle3Draft | None,
    tensors: dict[str, torch.Tensor],
    recipe: Recipe,
    held_out: list[dict[str, torch.Tensor]],
    weight_of: Callable[[str], torch.Tensor],
    linears: tuple[str, ...],
) -> Measurement:
    """Layer stats (always) and, with a model and held-out batches, SQNR and top-1 agreement.

    ``weight_of(name)`` gives the BF16 weight of one of ``linears`` (every decoder
    layer's; one at a time, so the file-to-file flow never needs the whole draft in memory).
    """
    layers = [_layer_stats(weight_of(name), tensors, name, recipe) for name in linears]
    if bf16 is None or not held_out:
        return Measurement(layers)
    device = next(bf16.fc.parameters()).device
    fp8 = simulated_fp8_draft(bf16, {k: v.to(device) for k, v in tensors.items()}, recipe)
    sqnr, agreement = _compare(bf16, fp8, held_out, recipe.calibration.steps)
    for stats in layers:
        stats.sqnr_db = sqnr[stats.name]
    tokens = sum(int(b["next_ids"].numel()) for b in held_out)
    return Measurement(layers, agreement, tokens)


def _layer_stats(
    weight: torch.Tensor, tensors: dict[str, torch.Tensor], name: str, recipe: Recipe
) -> LayerStats:
    """``weight_scale``: the largest one (an OCP MX weight's largest block scale)."""
    input_scale = tensors.get(f"{name}.input_scale")
    scale = float(input_scale) if input_scale is not None else None
    weight_scale = tensors[f"{name}.weight_scale"]
    if recipe.mx_weights:
        weight_scale = mx.block_scales(weight_scale)
    return LayerStats(
        name=name,
        weight_amax=float(weight.abs().max()),
        weight_scale=float(weight_scale.float().max()),
        input_amax=scale * FP8_E4M3_MAX if scale is not None else None,
        input_scale=scale,
    )


def _compare(
    bf16: Eagle3Draft, fp8: Eagle3Draft, batches: list[dict[str, torch.Tensor]], steps: int
) -> tuple[dict[str, float], list[float]]:
    """One pass of each draft over ``batches``: per-layer SQNR and per-step top-1 agreement.

    SQNR: each FP8 layer's output against the exact layer on the same input.
    """
    signal: dict[str, float] = dict.fromkeys(bf16.dims.linears, 0.0)
    noise: dict[str, float] = dict.fromkeys(bf16.dims.linears, 0.0)

    def hook(name: str):  # type: ignore[no-untyped-def]
        exact_weight = bf16.linear_weight(name)

        def record(_module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            exact = compute.linear(args[0], exact_weight)
            signal[name] += float(exact.pow(2).sum())
            noise[name] += float((exact - compute.round_as(out, exact_weight.dtype)).pow(2).sum())

        return record

    same, total = [0] * steps, 0
    handles = [fp8.get_submodule(n).register_forward_hook(hook(n)) for n in bf16.dims.linears]
    try:
        with torch.no_grad():
            for batch in tqdm(batches, desc="measuring", unit="batch", disable=None):
                aux, ids = batch["aux_hidden"], batch["next_ids"]
                for rows in compute.micro_batches(aux.shape[0], aux.shape[1]):
                    ref = bf16.unroll(aux[rows], ids[rows], steps, keep_logits=False)
                    got = fp8.unroll(aux[rows], ids[rows], steps, keep_logits=False)
                    for k in range(steps):
                        same[k] += int((_top1(ref[k]) == _top1(got[k])).sum())
                total += int(ids.numel())
    finally:
        for handle in handles:
            handle.remove()
    sqnr = {
        n: 10 * math.log10(signal[n] / noise[n]) if noise[n] > 0 else math.inf
        for n in bf16.dims.linears
    }
    return sqnr, [s / total for s in same]


def _top1(step: StepOutput) -> torch.Tensor:
    assert step.top1 is not None
    return step.top1
