"""Scale plausibility (validate check 6): what the draft's scales do, judged on real values.

Whatever made the draft (``eaglequant export``, ModelOpt, llm-compressor, Quark's
file-to-file flow), check 6 judges each quantized linear by its effect, never by a scale's
ratio to a maximum (FP8 is floating point: a scale 1000x too large can cost nothing, and
ModelOpt's fixed 1.0 input scales are fine wherever the values sit in E4M3's normal range):

* **weights**: the stored FP8 weight dequantized with the scales as the checkpoint holds
  them (per tensor, per channel, 2-D blocks, OCP MX) against the BF16 baseline's weight;
* **inputs** (static input scales only: dynamic ones have none): the values each linear
  really sees, quantized with the draft's ``input_scale``: the fraction clipped at
  +-448 x scale, the fraction below E4M3's smallest normal (2^-6 x scale) and the SQNR;
* **K/V scales**: the same, on the K and V projections' outputs (before RoPE, as Quark
  calibrates them).

Each is compared with what a calibrated scale gives on the same values (amax / 448 per
tensor; an MX weight: MX rounding). A layer fails when its RMS error exceeds ``tolerance``
times the calibrated one's (its SQNR falls more than 20 log10(tolerance) dB below it); the
problem names the tensor and whether the error is clipping or underflow. A missing or
non-finite scale, or a layout the check does not know, fails the check with its reason.

The values come from validate's own vLLM run of the BF16 draft (``draft_ranges``: a
histogram of each linear's |input|), else from the draft module unrolled over k steps on
the target's hidden states for the validation sequences (captured now, or given).
The arithmetic is :mod:`eaglequant.validate.scale_effects`.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from eaglequant.capture.run import capture_into
from eaglequant.capture.store import load_capture
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import Checkpoint
from eaglequant.recipe import E8M0_NAN
from eaglequant.results.engine_result import LinearRange, MagnitudesJson
from eaglequant.results.validation_report import Check, CheckId
from eaglequant.rules.draft import DraftDims, dims_from_config, kv_scale_name
from eaglequant.rules.exclusions import predict_fates
from eaglequant.rules.target_fit import check_target_fits
from eaglequant.validate.draft_ranges import checkpoint_entries

ENGINE_RANGES, CAPTURED_RANGES = "engine", "capture"
# A static scale may clip this share of the tokens (rows) it quantizes: the attention-sink
# tokens' massive activations, which a fixed scale clips at no cost to acceptance.
MAX_TOKENS_CLIPPED = 0.05  # where check 6's ranges came from

if TYPE_CHECKING:
    from eaglequant.capture.run import CaptureEngine
    from eaglequant.capture.store import CalibrationData


class WeightNumbers(TypedDict):
    """A quantized linear's dequantized weight against the BF16 baseline's."""

    layout: str
    error: float  # relative RMS error
    calibrated_error: float  # of a calibrated per-tensor E4M3 rounding (MX: MX rounding)
    sqnr_db: float | None
    calibrated_sqnr_db: float | None


class ScaleNumbers(TypedDict):
    """What a static scale does to the measured values, beside a calibrated one's (SQNR: the
    mean over tokens of each token's error power over its power, in dB)."""

    scale: float
    amax: float
    clipped: float  # fraction of values beyond +-448 x scale
    underflow: float  # fraction of nonzero values below 2^-6 x scale
    tokens_clipped: float  # fraction of tokens with a value clipped
    sqnr_db: float | None
    unclipped_sqnr_db: float | None  # over the tokens it does not clip
    calibrated_sqnr_db: float | None
    cause: str  # where the error beyond rounding comes from: clipping or underflow


class LayerScales(TypedDict, total=False):
    """One linear's row of check 6's numbers."""

    input_amax: float
    weight: WeightNumbers
    input: ScaleNumbers | str  # a string: why no static input scale is judged ("dynamic")
    kv: ScaleNumbers  # K or V (k_proj's or v_proj's output) with its calibrated scale


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
    # the measured values without a capture, where they cover every linear judged.
    engine_ranges: Mapping[str, LinearRange] | None = None


@dataclass
class Measured:
    """Each judged linear's |input| histogram and, for K/V projections, its |output|'s."""

    inputs: dict[str, MagnitudesJson]
    outputs: dict[str, MagnitudesJson]
    source: str


def max_sqnr_loss_db(tolerance: float) -> float:
    """The SQNR a layer may lose against a calibrated scale: its RMS error may be at most
    ``tolerance`` times the calibrated one's."""
    return 20 * math.log10(tolerance)


def scale_plausibility(
    inputs: PlausibilityInputs, progress: Callable[[str], None] = lambda _m: None
) -> Check:
    """Check 6: what the FP8 draft's scales do to its weights and to the values its linears
    and KV cache really see, against what calibrated scales do to the same values."""
    problems, numbers = plausibility_problems(inputs, progress)
    detail = (
        f"every quantized layer within {inputs.tolerance:g}x the RMS error of a calibrated "
        f"scale on the same values (SQNR loss at most {numbers['max_sqnr_loss_db']:.1f} dB)"
        if not problems
        else "; ".join(problems)
    )
    return Check(CheckId.SCALES, not problems, detail, numbers)


def plausibility_problems(
    inputs: PlausibilityInputs, progress: Callable[[str], None] = lambda _m: None
) -> tuple[list[str], dict[str, Any]]:
    """Check 6's problems (each naming the tensor and what is wrong) and its numbers."""
    fp8, baseline = inputs.draft, inputs.baseline
    limit = max_sqnr_loss_db(inputs.tolerance)
    quantized = quantized_linears(fp8)
    fates = {
        name: fate for fate in predict_fates(fp8.flat_config) for name in fate.checkpoint_names
    }
    numbers: dict[str, Any] = {
        "layers": {},
        "tolerance": inputs.tolerance,
        "max_sqnr_loss_db": round(limit, 2),
    }
    if not quantized:
        return ["the draft stores no quantized linear weight (nothing to judge)"], numbers
    rows: dict[str, LayerScales] = {name: {} for name in quantized}
    numbers["layers"] = rows
    problems: list[str] = []
    static = []
    for name in quantized:
        fate = fates.get(name)
        block = fate.block if fate else None
        problems += _judge_weight(fp8, baseline, name, block, limit, rows[name])
        if fate is None or fate.linear_method in ("unknown", "none"):
            why = fate.reason if fate else "vLLM builds no such draft linear"
            problems.append(f"{name}: how vLLM quantizes its inputs is not known here ({why})")
        elif fate.static_input:
            static.append(name)
        else:
            rows[name]["input"] = "dynamic" if fate.quantized else "not quantized"
    kv = _kv_linears(fp8)
    if static or kv:
        measured = _measured(inputs, sorted(set(quantized) | set(kv)), progress)
        numbers["ranges_from"] = measured.source
        for name in quantized:
            if name in measured.inputs:
                rows[name]["input_amax"] = measured.inputs[name]["amax"]
        for name in static:
            problems += _judge_input(fp8, name, measured, limit, rows[name])
        problems += _judge_kv(fp8, kv, measured, limit, rows)
    return problems, numbers


def quantized_linears(fp8: Checkpoint) -> list[str]:
    """Every linear whose weight the draft stores quantized (E4M3, or MX with E8M0 scales), in
    the checkpoint's order."""
    names = []
    for key, info in fp8.tensors.items():
        if not key.endswith(".weight"):
            continue
        name = key.removesuffix(".weight")
        if info.dtype == "F8_E4M3" or f"{name}.weight_scale" in fp8.tensors:
            names.append(name)
    return names


def _kv_linears(fp8: Checkpoint) -> list[str]:
    """The K and V projections whose outputs the draft's K/V scales quantize."""
    linears = [key.removesuffix(".weight") for key in fp8.tensors if key.endswith(".weight")]
    return [n for n in linears if (scale := kv_scale_name(n)) and scale in fp8.tensors]


def _judge_weight(
    fp8: Checkpoint,
    baseline: Checkpoint,
    name: str,
    block: tuple[int, int] | None,
    limit: float,
    row: LayerScales,
) -> list[str]:
    """The dequantized weight against the baseline's, beside a calibrated rounding of it."""
    # lazy: torch-free core
    import torch

    # lazy: torch-free core
    from eaglequant.model import mx
    from eaglequant.validate import scale_effects as effects

    key = f"{name}.weight"
    if key not in baseline.tensors:
        return [f"{key}: the BF16 baseline has no such tensor to compare with"]
    scale, problems = _finite_positive_scale(fp8, f"{name}.weight_scale", "")
    if scale is None:
        return problems
    values, bf16 = fp8.load_tensor(key), baseline.load_tensor(key).float()
    stored = fp8.tensors[f"{name}.weight_scale"]
    if stored.dtype == "U8":  # OCP MX: E8M0 exponents per 32 input elements
        dtype = "mxfp4" if fp8.tensors[key].dtype == "U8" else "mxfp8_e4m3"
        exponents = fp8.load_tensor(f"{name}.weight_scale").view(torch.uint8)
        rows, cols = bf16.shape
        wrong = effects.mx_block_check(rows, cols, tuple(exponents.shape))
        if wrong is not None:
            return [f"{name}.weight_scale {wrong}"]
        if bool((exponents == E8M0_NAN).any()):
            return [f"{name}.weight_scale holds the E8M0 NaN exponent {E8M0_NAN}"]
        dequantized = mx.dequantize(values, exponents, dtype)
        calibrated, layout = mx.quantize_dequantize(bf16, dtype), dtype
    else:
        if values.dtype != torch.float8_e4m3fn:
            return [f"{key} is stored as {fp8.tensors[key].dtype}, not FP8 E4M3, with a scale"]
        if tuple(values.shape) != tuple(bf16.shape):
            return [f"{key} has shape {list(values.shape)}, the baseline's {list(bf16.shape)}"]
        found = effects.dequantize(values, fp8.load_tensor(f"{name}.weight_scale"), block)
        if isinstance(found, str):
            return [f"{name}.weight_scale {found}"]
        dequantized, layout = found
        calibrated = effects.calibrated_fp8(bf16)
    effect = effects.weight_effect(dequantized, bf16, calibrated, layout)
    row["weight"] = {
        "layout": layout,
        "error": _rounded(effect.error),
        "calibrated_error": _rounded(effect.calibrated_error),
        "sqnr_db": _db(effect.sqnr_db),
        "calibrated_sqnr_db": _db(effect.calibrated_sqnr_db),
    }
    if not math.isfinite(effect.error):
        return [f"{key} dequantizes to non-finite values ({layout} scales)"]
    if effect.calibrated_sqnr_db - effect.sqnr_db > limit:
        return [
            f"{key} ({layout} scales): relative error {effect.error:.3g} against "
            f"{effect.calibrated_error:.3g} for a calibrated scale (SQNR "
            f"{effect.sqnr_db:.1f} dB against {effect.calibrated_sqnr_db:.1f} dB)"
        ]
    return []


def _judge_input(
    fp8: Checkpoint, name: str, measured: Measured, limit: float, row: LayerScales
) -> list[str]:
    placeholder = " (vLLM would load its -3.4e38 placeholder silently)"
    observed = _observed(f"{name}.input_scale", measured.inputs[name])
    if observed:
        return observed
    scale, problems = _finite_positive_scale(fp8, f"{name}.input_scale", placeholder)
    if scale is None:
        return problems
    if scale.numel() != 1:
        return [f"{name}.input_scale has {scale.numel()} values; a static input scale has one"]
    numbers, problem = _judge_scale(f"{name}.input_scale", measured.inputs[name], scale, limit)
    row["input"] = numbers
    return problem


def _judge_kv(
    fp8: Checkpoint,
    kv: list[str],
    measured: Measured,
    limit: float,
    rows: dict[str, LayerScales],
) -> list[str]:
    """Each K or V scale on its projection's measured outputs (before RoPE, as Quark
    calibrates them), beside amax / 448 of those outputs."""
    problems = []
    for linear in kv:
        key = kv_scale_name(linear)
        assert key is not None
        scale, found = _finite_positive_scale(fp8, key, "")
        if scale is None or (found := _observed(key, measured.outputs.get(linear))):
            problems += found
            continue
        numbers, problem = _judge_scale(key, measured.outputs[linear], scale, limit)
        rows[linear]["kv"] = numbers
        problems += problem
    return problems


def _judge_scale(
    key: str, values: MagnitudesJson, scale: Any, limit: float
) -> tuple[ScaleNumbers, list[str]]:
    """One static scale on the values it quantizes, against amax / 448 of those values: it
    fails when it clips more than :data:`MAX_TOKENS_CLIPPED` of the tokens, or when on the
    tokens it does not clip its SQNR falls more than ``limit`` dB below the calibrated one's."""
    # lazy: torch-free core
    from eaglequant.validate import scale_effects as effects

    effect = effects.input_effect(values, float(scale.flatten()[0]))
    calibrated = effects.input_effect(values, effects.calibrated_scale(values))
    loss = calibrated.sqnr_db - effect.unclipped_sqnr_db
    clipping = effect.tokens_clipped > MAX_TOKENS_CLIPPED
    numbers: ScaleNumbers = {
        "scale": effect.scale,
        "amax": values["amax"],
        "clipped": _rounded(effect.clipped),
        "underflow": _rounded(effect.underflow),
        "tokens_clipped": _rounded(effect.tokens_clipped),
        "sqnr_db": _db(effect.sqnr_db),
        "unclipped_sqnr_db": _db(effect.unclipped_sqnr_db),
        "calibrated_sqnr_db": _db(calibrated.sqnr_db),
        "cause": "clipping" if clipping or effect.tokens_clipped else effect.cause,
    }
    if clipping:
        return numbers, [
            f"{key} = {effect.scale:.4g}: clipping, {effect.tokens_clipped:.1%} of the tokens "
            f"have values beyond +-448 x scale ({effect.clipped:.2%} of the values; at most "
            f"{MAX_TOKENS_CLIPPED:.0%} of the tokens may be): SQNR {effect.sqnr_db:.1f} dB "
            f"against {calibrated.sqnr_db:.1f} dB for amax / 448 = {calibrated.scale:.4g} "
            f"(measured amax {values['amax']:.4g})"
        ]
    if loss <= limit:
        return numbers, []
    numbers["cause"] = "underflow"
    return numbers, [
        f"{key} = {effect.scale:.4g}: underflow, {effect.underflow:.1%} of the values below "
        f"the smallest normal 2^-6 x scale: SQNR {effect.unclipped_sqnr_db:.1f} dB against "
        f"{calibrated.sqnr_db:.1f} dB for amax / 448 = {calibrated.scale:.4g} (measured amax "
        f"{values['amax']:.4g})"
    ]


def _observed(key: str, values: MagnitudesJson | None) -> list[str]:
    """Why the values ``key`` quantizes cannot judge it (none seen, non-finite), or nothing."""
    if values is None or not any(values["count"]):
        return [f"{key}: no nonzero value it quantizes was observed (nothing to judge)"]
    if values["nonfinite"]:
        return [f"{key}: the BF16 draft gave {values['nonfinite']} non-finite values here"]
    return []


def _rounded(value: float) -> float:
    return float(f"{value:.4g}")


def _db(value: float) -> float | None:
    """dB for the report: None where there was no error at all."""
    return round(value, 2) if math.isfinite(value) else None


def _measured(
    inputs: PlausibilityInputs, linears: list[str], progress: Callable[[str], None]
) -> Measured:
    """Each linear's |input| histogram and the K/V projections' |output| ones: from vLLM's
    own run of the BF16 draft (``engine``), else the draft module on the target's states
    (``capture`` made now, or the given ``hidden_states``)."""
    if inputs.hidden_states is None and inputs.engine_ranges is not None:
        found = _engine_magnitudes(inputs.engine_ranges, linears)
        if not isinstance(found, str):
            return found
        progress(f"check 6: {found}; capturing the target's states instead")
    return _captured_magnitudes(inputs, linears)


def _engine_magnitudes(ranges: Mapping[str, LinearRange], linears: list[str]) -> Measured | str:
    entries = checkpoint_entries(ranges, tuple(linears))
    if isinstance(entries, str):
        return entries
    measured = Measured({}, {}, ENGINE_RANGES)
    for linear, (entry, part) in entries.items():
        if "input_magnitudes" not in entry:
            return f"vLLM's ranges hold no histogram of {linear}'s inputs"
        measured.inputs[linear] = entry["input_magnitudes"]
        outputs = entry.get("output_magnitudes") or []
        if len(outputs) > part:
            measured.outputs[linear] = outputs[part]
    return measured


def _captured_magnitudes(inputs: PlausibilityInputs, linears: list[str]) -> Measured:
    """The BF16 draft module unrolled over k steps on the target's states, hooked."""
    # lazy: torch-free core
    import torch

    # lazy: torch-free core
    from eaglequant.model.load import load_draft_module
    from eaglequant.validate.scale_effects import Magnitudes

    baseline = inputs.baseline
    dims = dims_from_config(baseline.flat_config)
    aux_ids = check_target_fits(inputs.target, dims)
    model = load_draft_module(baseline)
    data = _target_states(inputs, aux_ids, dims)
    if model.embed_tokens is None:
        if data.embed_tokens is None:
            raise InputError(
                f"{inputs.hidden_states}: the draft has no embed_tokens and the capture holds "
                "none; capture with --embeddings"
            )
        model.embed_tokens = torch.nn.Embedding.from_pretrained(data.embed_tokens, freeze=True)
    hooked = [n for n in linears if n != "fc"]
    ins = {n: Magnitudes() for n in linears}
    outs = {n: Magnitudes() for n in hooked if kv_scale_name(n)}

    def hook(name: str) -> Any:
        def record(_module: Any, args: tuple[Any, ...], out: Any) -> None:
            ins[name].add(args[0].to(model.gemm_dtype))
            if name in outs:
                outs[name].add(out.to(model.gemm_dtype))

        return record

    unknown = [n for n in hooked if n not in dims.linears]
    if unknown:
        raise InputError(f"{baseline.folder}: the draft module has no linear {unknown[0]}")
    handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in hooked]
    try:
        with torch.no_grad():
            for batch in data.batches(1):
                if "fc" in ins:
                    ins["fc"].add(model.fc_input(batch["aux_hidden"]).to(model.gemm_dtype))
                model.unroll(
                    batch["aux_hidden"],
                    batch["next_ids"],
                    inputs.k,
                    keep_logits=False,
                    score_last=False,
                )
    finally:
        for handle in handles:
            handle.remove()
    source = "hidden_states" if inputs.hidden_states else CAPTURED_RANGES
    return Measured(
        {n: h.to_json() for n, h in ins.items()},
        {n: h.to_json() for n, h in outs.items()},
        source,
    )


def _target_states(
    inputs: PlausibilityInputs, aux_ids: tuple[int, ...], dims: DraftDims
) -> CalibrationData:
    """The target's auxiliary states: a given capture, else captured now on the validation
    sequences (each prompt and the target's own continuation) with the chosen engine."""
    if inputs.hidden_states is not None:
        return load_capture(inputs.hidden_states, dims)

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
    # lazy: torch-free core
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    return [
        tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
        + (generated[i] if generated else [])
        for i, prompt in enumerate(prompts)
    ]


def _finite_positive_scale(fp8: Any, key: str, if_missing: str) -> tuple[Any, list[str]]:
    """The scale tensor (flattened, float32), or the problem that stops the check."""
    if key not in fp8.tensors:
        return None, [f"{key} is missing{if_missing}"]
    scale = fp8.load_tensor(key).float().flatten()
    if not bool((scale > 0).all() and scale.isfinite().all()):
        return None, [f"{key} is not finite positive ({scale.min().item():.3g})"]
    return scale, []
