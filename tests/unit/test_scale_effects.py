"""Check 6's arithmetic on in-code tensors: the histogram's clipped and underflow fractions and
SQNR against the exact E4M3 cast, the cause it names, and weights dequantized by layout."""

from __future__ import annotations

import math

import pytest
import torch

from eaglequant.model import mx
from eaglequant.validate.scale_effects import (
    Magnitudes,
    calibrated_fp8,
    calibrated_scale,
    dequantize,
    input_effect,
    merge,
    weight_effect,
)

ROWS, WIDTH = 1000, 100


def _values(kind: str) -> torch.Tensor:
    """[tokens, features]: Gaussian; heavy-tailed with tokens of very different size; tiny."""
    generator = torch.Generator().manual_seed(0)
    normal = torch.randn(ROWS, WIDTH, generator=generator)
    if kind == "normal":
        return normal
    if kind == "heavy":  # log-normal values, and a few tokens 300x the rest (attention sinks)
        tokens = torch.ones(ROWS, 1)
        tokens[::100] = 300
        return normal * torch.exp(torch.randn(ROWS, WIDTH, generator=generator)) * tokens
    return normal.sign() * torch.rand(ROWS, WIDTH, generator=generator) * 1e-3  # all tiny


def _exact(x: torch.Tensor, scale: float) -> tuple[float, float, float]:
    """(SQNR dB: the mean over tokens of each one's error power over its power; clipped;
    underflow) of vLLM's static FP8 input quantization, done."""
    q = (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale
    ratio = ((q - x) ** 2).double().sum(-1) / (x * x).double().sum(-1)
    sqnr = -10 * math.log10(float(ratio.mean()))
    y = (x / scale).abs()
    return sqnr, float((y > 448).float().mean()), float(((y < 2**-6) & (y > 0)).float().mean())


def _histogram(*tensors: torch.Tensor) -> Magnitudes:
    h = Magnitudes()
    for t in tensors:
        h.add(t)
    return h


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["normal", "heavy", "tiny"])
@pytest.mark.parametrize("factor", [1.0, 1e-3, 0.1, 10.0, 1e3, 1e4])
def test_the_histogram_gives_the_exact_casts_fractions_and_sqnr(kind: str, factor: float) -> None:
    x = _values(kind)
    h = _histogram(x).to_json()
    scale = calibrated_scale(h) * factor
    effect = input_effect(h, scale)
    sqnr, clipped, underflow = _exact(x, scale)
    assert effect.sqnr_db == pytest.approx(sqnr, abs=1.0)
    assert effect.clipped == pytest.approx(clipped, abs=2e-3)
    assert effect.underflow == pytest.approx(underflow, abs=2e-3)


@pytest.mark.unit
def test_a_calibrated_scale_gives_e4m3s_rounding_alone() -> None:
    """amax / 448: nothing clipped, and the SQNR of 3 mantissa bits (about 31.5 dB)."""
    h = _histogram(_values("normal")).to_json()
    effect = input_effect(h, calibrated_scale(h))
    assert effect.clipped == 0 and effect.underflow < 1e-3
    assert 31 < effect.sqnr_db < 32


@pytest.mark.unit
def test_the_cause_is_clipping_for_a_small_scale_and_underflow_for_a_large_one() -> None:
    h = _histogram(_values("heavy")).to_json()
    calibrated = calibrated_scale(h)
    small, large = input_effect(h, calibrated / 1000), input_effect(h, calibrated * 1e4)
    assert small.cause == "clipping" and small.clip_error > 0.99
    assert large.cause == "underflow" and large.underflow_error > 0.99
    assert large.underflow > 0.999
    assert small.sqnr_db < 12 and large.sqnr_db < 12


@pytest.mark.unit
def test_fp8_is_floating_point_a_scale_too_large_by_100_costs_nothing_on_a_gaussian() -> None:
    """The reason check 6 judges effects, not ratios: 100x amax / 448 underflows 1% of a
    Gaussian's values and keeps its SQNR."""
    h = _histogram(_values("normal")).to_json()
    calibrated = input_effect(h, calibrated_scale(h))
    large = input_effect(h, calibrated_scale(h) * 100)
    assert large.underflow > 0.01
    assert abs(calibrated.sqnr_db - large.sqnr_db) < 0.1


@pytest.mark.unit
def test_histograms_merge_and_round_trip_json_and_count_zeros_and_non_finite() -> None:
    x = _values("normal")
    one = _histogram(x[:5], torch.zeros(1, 7), torch.tensor([[math.inf, math.nan, 1.0]]))
    two = _histogram(x[5:10])
    merged = merge([one.to_json(), two.to_json()])
    whole = _histogram(x[:10], torch.tensor([[1.0]])).to_json()
    assert merged["zeros"] == 7 and merged["nonfinite"] == 2 and merged["rows"] == 11
    assert merged["amax"] == whole["amax"] and sum(merged["count"]) == 1001
    assert input_effect(merged, 0.01).sqnr_db == pytest.approx(input_effect(whole, 0.01).sqnr_db)


@pytest.mark.unit
def test_no_nonzero_value_or_a_bad_scale_is_refused() -> None:
    empty = _histogram(torch.zeros(2, 3)).to_json()
    with pytest.raises(ValueError, match="no nonzero value"):
        input_effect(empty, 1.0)
    h = _histogram(torch.ones(3)).to_json()
    for scale in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="not finite positive"):
            input_effect(h, scale)


def _quantized(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (weight / scale).clamp(-448, 448).to(torch.float8_e4m3fn)


WEIGHT = torch.randn(300, 200, generator=torch.Generator().manual_seed(2)) / 10


@pytest.mark.unit
@pytest.mark.parametrize(
    ("layout", "scale", "block"),
    [
        ("per-tensor", WEIGHT.abs().max().reshape(1) / 448, None),
        ("per-channel", WEIGHT.abs().amax(1) / 448, None),
        ("per-channel", WEIGHT.abs().amax(1, keepdim=True) / 448, None),
        ("block 128x128", None, (128, 128)),
        ("block 64x32", None, (64, 32)),
    ],
)
def test_each_layout_dequantizes_to_within_e4m3s_rounding(
    layout: str, scale: torch.Tensor | None, block: tuple[int, int] | None
) -> None:
    """Per tensor, per channel ([N] or [N, 1]) and ragged 2-D blocks [ceil(N/bn), ceil(K/bk)]:
    every element within half an E4M3 step (2^-4 relative) of the weight, or a subnormal step."""
    if block is not None:
        bn, bk = block
        rows, cols = math.ceil(300 / bn), math.ceil(200 / bk)
        padded = torch.zeros(rows * bn, cols * bk)
        padded[:300, :200] = WEIGHT.abs()
        scale = padded.view(rows, bn, cols, bk).amax((1, 3)) / 448
        full = scale.repeat_interleave(bn, 0)[:300].repeat_interleave(bk, 1)[:, :200]
    else:
        assert scale is not None
        full = scale.reshape(-1, 1) if scale.numel() > 1 else scale
    found = dequantize(_quantized(WEIGHT, full), scale, block)
    assert not isinstance(found, str), found
    weight, name = found
    assert name == layout
    allowed = torch.maximum(WEIGHT.abs() * 2**-4, full * 2**-10 * torch.ones_like(WEIGHT))
    assert bool(((weight - WEIGHT).abs() <= allowed * 1.0001).all())
    effect = weight_effect(weight, WEIGHT, calibrated_fp8(WEIGHT), name)
    assert effect.error < effect.calibrated_error * 1.05  # E4M3 rounds relative to any scale


@pytest.mark.unit
def test_a_scale_ten_times_too_large_is_a_relative_error_of_nine() -> None:
    scale = WEIGHT.abs().max().reshape(1) / 448
    found = dequantize(_quantized(WEIGHT, scale), scale * 10, None)
    assert not isinstance(found, str)
    effect = weight_effect(found[0], WEIGHT, calibrated_fp8(WEIGHT), found[1])
    assert effect.error == pytest.approx(9, rel=1e-2)
    assert 31 < effect.calibrated_sqnr_db < 32 and effect.sqnr_db < -19


@pytest.mark.unit
def test_a_layout_it_does_not_know_is_said_not_guessed() -> None:
    values = _quantized(WEIGHT, torch.tensor(0.001))
    assert dequantize(values, torch.ones(45, 576), None) == (
        "has shape [45, 576]: not a layout check 6 knows ([1], [300] or [300, 1], "
        "or blocks that the config declares (none declared))"
    )
    assert dequantize(values, torch.ones(4, 2), (128, 128)) == (
        "has shape [4, 2]; the config's 128x128 blocks of a [300, 200] weight need [3, 2]"
    )
    assert dequantize(values, torch.ones(7), None) == (
        "has shape [7]: not a layout check 6 knows ([1], [300] or [300, 1])"
    )


@pytest.mark.unit
@pytest.mark.parametrize("dtype", ["mxfp8_e4m3", "mxfp4"])
def test_mx_calibrated_rounding_is_the_reference_for_mx_weights(dtype: str) -> None:
    """An MX weight is judged against MX rounding of the same weight (its own format)."""
    reference = mx.quantize_dequantize(WEIGHT[:, :192], dtype)
    effect = weight_effect(reference, WEIGHT[:, :192], reference, dtype)
    assert effect.error == effect.calibrated_error
    assert effect.sqnr_db > (30 if dtype == "mxfp8_e4m3" else 15)


@pytest.mark.unit
def test_tokens_clipped_and_the_unclipped_tokens_sqnr_are_the_exact_ones() -> None:
    """A scale that clips the few huge tokens alone: their share of tokens, and the SQNR of
    the others as if they were alone (what a calibrated scale on them would be held to)."""
    x = _values("heavy")
    h = _histogram(x).to_json()
    ordinary = x[(torch.arange(ROWS) % 100) != 0]
    scale = float(ordinary.abs().max()) / 448
    effect = input_effect(h, scale)
    assert effect.tokens_clipped == pytest.approx(0.01, abs=2e-3)  # a bin straddles the limit
    assert effect.unclipped_sqnr_db == pytest.approx(_exact(ordinary, scale)[0], abs=1.0)
    assert effect.sqnr_db < effect.unclipped_sqnr_db - 10  # the clipped tokens, counted
