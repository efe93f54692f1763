"""Scale plausibility (validate check 6), computed outside vLLM with the project's own draft module.

The BF16 baseline draft runs on the target's auxiliary hidden states for the
validation sequences (prompt + the target's own greedy continuation), unrolled
over k speculative steps; each midlayer linear's input range is recorded and
compared with the FP8 artifact's ``input_scale`` x 448. ``weight_scale`` x 448
is compared with the BF16 weight's amax (per tensor, or per output row for
per-channel scales); an OCP MX weight's E8M0 exponents (one per 32 input
elements) are checked for shape and NaN, and each block's scale x the element
maximum against that block's amax. Calibrated K/V scales x 448 are compared with the larger
of their layer's k_proj and v_proj output ranges (before RoPE, as Quark calibrates them).
Acceptance alone cannot catch these: FP8 is floating
point, so a scale 1000x too large leaves acceptance unchanged, and a missing
``input_scale`` loads silently as vLLM's -3.4e38 placeholder.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from eaglequant.draft import KV_SCALES, DraftDims, dims_from_config, kv_scale_name
from eaglequant.engine.result import LinearRange
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import Checkpoint
from eaglequant.io.model_config import DraftConfig
from eaglequant.recipe import E8M0_NAN, FP8_E4M3_MAX, MX_BLOCK
from eaglequant.validate.draft_ranges import checkpoint_ranges
from eaglequant.validation_report import Check, CheckId

ENGINE_RANGES, CAPTURED_RANGES = "engine", "capture"  # where check 6's ranges came from

if TYPE_CHECKING:
    from eaglequant.capture.run import CaptureEngine
    from eaglequant.capture.store import CalibrationData


class LayerScales(TypedDict, total=False):
    """One linear's row of check 6's numbers: its measured ranges and scales x the element max."""

    input_amax: float
    input_scale_x448: float
    weight_scale_x448: float
    weight_amax: float
    weight_scale_worst_ratio: float
    weight_exponent_range: list[int]
    output_amax: float | None
    kv_scale_x448: float


@dataclass(frozen=True, kw_only=True)
class PlausibilityInputs:
    """What check 6 reads: the pair, the drafts, the validation sequences and the tolerance."""

    target: Path
    draft: Checkpoint
    baseline: Checkpoint
    prompts: list[str]
    generated: list[list[int]] | None
    k: int
    tolerance: float
    capture: CaptureEngine
    hidden_states: Path | None = None
    add_special_tokens: bool = True
    # The BF16 draft's linears as vLLM ran them in validate's own engine (``draft_ranges``):
    # the measured ranges without a capture, where they cover every linear.
    engine_ranges: Mapping[str, LinearRange] | None = None


def scale_plausibility(
    inputs: PlausibilityInputs, progress: Callable[[str], None] = lambda _m: None
) -> Check:
    """Check 6: the FP8 artifact's scales against ranges the BF16 draft really produces."""
    problems, numbers = plausibility_problems(inputs, progress)
    detail = (
        f"every scale within {inputs.tolerance}x of the measured range"
        if not problems
        else "; ".join(problems)
    )
    return Check(CheckId.SCALES, not problems, detail, numbers)


def plausibility_problems(
    inputs: PlausibilityInputs, progress: Callable[[str], None] = lambda _m: None
) -> tuple[list[str], dict[str, Any]]:
    from eaglequant.model.load import load_draft_module
    from eaglequant.target_fit import check_target_fits

    fp8, baseline = inputs.draft, inputs.baseline
    dims = dims_from_config(baseline.flat_config)
    aux_ids = check_target_fits(inputs.target, dims)
    model = load_draft_module(baseline)
    measured, outputs, source = _measured_ranges(inputs, model, dims, aux_ids, progress)
    static_inputs = _static_inputs(fp8.flat_config)
    problems: list[str] = []
    numbers: dict[str, LayerScales] = {}
    for name in dims.linears:
        weight_amax = model.linear_weight(name).detach().abs()
        row: LayerScales = {"input_amax": measured[name]}
        problems += _check_weight_scale(fp8, name, weight_amax, inputs.tolerance, row)
        if static_inputs:
            problems += _check_input_scale(fp8, name, measured[name], inputs.tolerance, row)
        numbers[name] = row
    problems += _check_kv_scales(fp8, dims.linears, outputs, inputs.tolerance, numbers)
    return problems, {"layers": numbers, "tolerance": inputs.tolerance, "ranges_from": source}


def _measured_ranges(
    inputs: PlausibilityInputs,
    model: Any,
    dims: DraftDims,
    aux_ids: tuple[int, ...],
    progress: Callable[[str], None],
) -> tuple[dict[str, float], dict[str, float], str]:
    """Each linear's input and output ranges, and where they come from: vLLM's own run of
    the BF16 draft (``engine``), else the draft module on the target's states (``capture``
    made now, or the given ``hidden_states``)."""
    import torch

    from eaglequant.model.ranges import input_amax

    if inputs.hidden_states is None and inputs.engine_ranges is not None:
        mapped = checkpoint_ranges(inputs.engine_ranges, dims.linears)
        if not isinstance(mapped, str):
            return *mapped, ENGINE_RANGES
        progress(f"check 6: {mapped}; capturing the target's states instead")
    data = _target_states(inputs, aux_ids, dims)
    if model.embed_tokens is None:
        if data.embed_tokens is None:
            raise InputError(
                f"{inputs.hidden_states}: the draft has no embed_tokens and the capture holds "
                "none; capture with --embeddings"
            )
        model.embed_tokens = torch.nn.Embedding.from_pretrained(data.embed_tokens, freeze=True)
    outputs: dict[str, float] = {}
    measured = input_amax(model, data.batches(1), inputs.k, outputs)
    return measured, outputs, "hidden_states" if inputs.hidden_states else CAPTURED_RANGES


def _check_kv_scales(
    fp8: Any,
    linears: tuple[str, ...],
    output_amax: dict[str, float],
    tolerance: float,
    numbers: dict[str, LayerScales],
) -> list[str]:
    """Each calibrated K or V scale x 448 against the larger of its layer's measured k_proj and
    v_proj output ranges (Quark gives K and V of one layer their common, larger scale)."""
    problems = []
    for linear in linears:
        name = kv_scale_name(linear)
        if name is None or name not in fp8.tensors:
            continue
        parent = linear.rpartition(".")[0]
        measured = max(output_amax.get(f"{parent}.{proj}", 0.0) for proj in KV_SCALES)
        scale, found = _finite_positive_scale(fp8, name, "")
        if scale is None:
            problems += found
            continue
        implied = float(scale[0]) * FP8_E4M3_MAX
        numbers[linear] |= {"output_amax": output_amax.get(linear), "kv_scale_x448": implied}
        owner, _, what = name.rpartition(".")
        problems += _ratio_problem(owner, what, implied, measured, tolerance)
    return problems


def _target_states(
    inputs: PlausibilityInputs, aux_ids: tuple[int, ...], dims: DraftDims
) -> CalibrationData:
    """The target's auxiliary states: a given capture, else captured now on the validation
    sequences (each prompt and the target's own continuation) with the chosen engine."""
    from eaglequant.capture.store import load_capture

    if inputs.hidden_states is not None:
        return load_capture(inputs.hidden_states, dims)
    from eaglequant.capture.run import capture_into

    sequences = validation_sequences(
        inputs.target, inputs.prompts, inputs.generated, inputs.add_special_tokens
    )
    with tempfile.TemporaryDirectory(prefix="eaglequant-check6-") as folder:
        capture_into(
            Path(folder),
            target=inputs.target,
            sequences=sequences,
            aux_ids=aux_ids,
            engine=inputs.capture,
            embeddings=True,
        )
        return load_capture(Path(folder), dims)


def validation_sequences(
    target: Path,
    prompts: list[str],
    generated: list[list[int]] | None,
    add_special_tokens: bool = True,
) -> list[list[int]]:
    """Each prompt's token ids (the target's tokenizer, as vLLM's) and the target's continuation.

    ``add_special_tokens`` False for chat-templated prompts, as vLLM's chat endpoint.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    return [
        tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
        + (generated[i] if generated else [])
        for i, prompt in enumerate(prompts)
    ]


def _static_inputs(config: DraftConfig) -> bool:
    spec = (
        (config.get("quantization_config") or {})
        .get("global_quant_config", {})
        .get("input_tensors")
    )
    spec = spec[0] if isinstance(spec, list) and spec else spec
    return isinstance(spec, dict) and not spec.get("is_dynamic")


def _ratio_problem(
    name: str, what: str, implied: float, measured: float, tolerance: float, times: str = "448"
) -> list[str]:
    ratio = implied / measured if measured > 0 else float("inf")
    if not (1 / tolerance <= ratio <= tolerance):
        return [
            f"{name}.{what} x {times} = {implied:.4g} but the measured range is {measured:.4g} "
            f"(off by {ratio:.3g}x, tolerance {tolerance}x)"
        ]
    return []


def _check_weight_scale(
    fp8: Any, name: str, weight_abs: Any, tolerance: float, row: LayerScales
) -> list[str]:
    key = f"{name}.weight_scale"
    if key in fp8.tensors and fp8.tensors[key].dtype == "U8":
        return _check_mx_weight_scale(fp8, name, weight_abs, tolerance, row)
    scale, problems = _finite_positive_scale(fp8, f"{name}.weight_scale", "")
    if scale is None:
        return problems
    if scale.numel() > 1:
        measured = weight_abs.amax(dim=1)
        ratios = scale * FP8_E4M3_MAX / measured.clamp_min(1e-30)
        worst = int((ratios.log().abs()).argmax())
        row["weight_scale_worst_ratio"] = float(ratios[worst])
        return _ratio_problem(
            name,
            f"weight_scale[{worst}]",
            float(scale[worst]) * FP8_E4M3_MAX,
            float(measured[worst]),
            tolerance,
        )
    implied = float(scale[0]) * FP8_E4M3_MAX
    row["weight_scale_x448"], row["weight_amax"] = implied, float(weight_abs.max())
    return _ratio_problem(name, "weight_scale", implied, float(weight_abs.max()), tolerance)


def _check_mx_weight_scale(
    fp8: Any, name: str, weight_abs: Any, tolerance: float, row: LayerScales
) -> list[str]:
    """OCP MX: one E8M0 exponent per 32 input elements; each block's scale x the element
    maximum (448 MXFP8, 6 MXFP4) must lie within ``tolerance`` of that block's BF16 amax."""
    import torch

    from eaglequant.model import mx

    key = f"{name}.weight_scale"
    exponents = fp8.load_tensor(key).view(torch.uint8)
    rows, cols = weight_abs.shape
    expected = (rows, cols // MX_BLOCK)
    if tuple(exponents.shape) != expected:
        return [f"{key} has shape {list(exponents.shape)}, expected {list(expected)} (E8M0 per 32)"]
    if bool((exponents == E8M0_NAN).any()):
        return [f"{key} holds the E8M0 NaN exponent {E8M0_NAN}"]
    dtype = "mxfp4" if fp8.tensors[f"{name}.weight"].dtype == "U8" else "mxfp8_e4m3"
    implied = mx.block_scales(exponents) * mx.ELEMENT_MAX[dtype]
    block_amax = weight_abs.float().view(rows, cols // MX_BLOCK, MX_BLOCK).amax(-1)
    row["weight_exponent_range"] = [int(exponents.min()), int(exponents.max())]
    live = block_amax > 0  # an all-zero block has no range to hold its scale to
    if not bool(live.any()):
        return []
    ratios = implied[live] / block_amax[live]
    worst = int(ratios.log().abs().argmax())
    row["weight_scale_worst_ratio"] = float(ratios[worst])
    flat = int(live.flatten().nonzero()[worst])
    block = f"weight_scale[{flat // expected[1]}, {flat % expected[1]}]"
    got, amax = float(implied[live][worst]), float(block_amax[live][worst])
    return _ratio_problem(name, block, got, amax, tolerance, f"{mx.ELEMENT_MAX[dtype]:g}")


def _check_input_scale(
    fp8: Any, name: str, measured: float, tolerance: float, row: LayerScales
) -> list[str]:
    placeholder = " (vLLM would load its -3.4e38 placeholder silently)"
    scale, problems = _finite_positive_scale(fp8, f"{name}.input_scale", placeholder)
    if scale is None:
        return problems
    implied = float(scale[0]) * FP8_E4M3_MAX
    row["input_scale_x448"] = implied
    return _ratio_problem(name, "input_scale", implied, measured, tolerance)


def _finite_positive_scale(fp8: Any, key: str, if_missing: str) -> tuple[Any, list[str]]:
    """The scale tensor (flattened, float32), or the problem that stops the check."""
    if key not in fp8.tensors:
        return None, [f"{key} is missing{if_missing}"]
    scale = fp8.load_tensor(key).float().flatten()
    if not bool((scale > 0).all() and scale.isfinite().all()):
        return None, [f"{key} is not finite positive ({scale.min().item():.3g})"]
    return scale, []
