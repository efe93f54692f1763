"""Check 6 on in-code drafts of other producers' layouts (no vLLM, no Quark, no target): the
values come as validate's engine hands them over, histograms of each linear's |input|."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglequant.capture.run import CaptureEngine
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.recipe import ValidationSpec
from eaglequant.results.engine_result import LinearRange
from eaglequant.rules.draft import MIDLAYER_LINEARS
from eaglequant.validate.plausibility import PlausibilityInputs, plausibility_problems
from eaglequant.validate.scale_effects import Magnitudes

DOWN = "midlayer.mlp.down_proj"
MODELOPT = {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}


def _block_config(block: list[int], dynamic: bool = True) -> dict[str, Any]:
    """llm-compressor's FP8_BLOCK as its model-free PTQ writes it."""
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "ignore": ["lm_head", "re:.*fc.*"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "block",
                    "block_structure": block,
                    "dynamic": False,
                    "symmetric": True,
                },
                "input_activations": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "group",
                    "group_size": block[1],
                    "dynamic": dynamic,
                    "symmetric": True,
                },
            }
        },
    }


def _fp8(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (weight.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)


def _block_scales(weight: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = weight.shape
    r, c = math.ceil(rows / bn), math.ceil(cols / bk)
    padded = torch.zeros(r * bn, c * bk)
    padded[:rows, :cols] = weight.float().abs()
    scale = padded.view(r, bn, c, bk).amax((1, 3)) / 448
    full = scale.repeat_interleave(bn, 0)[:rows].repeat_interleave(bk, 1)[:, :cols]
    return scale, full


def _draft(baseline: Path, out: Path, quant: dict[str, Any], layout: str) -> Path:
    """The baseline with its decoder layer's linears quantized as ``layout`` says."""
    shutil.copytree(baseline, out)
    tensors = load_file(str(out / "model.safetensors"))
    for name in MIDLAYER_LINEARS:
        weight = tensors[f"{name}.weight"]
        if layout == "block":
            scale, full = _block_scales(weight, 32, 32)
        else:
            scale = full = weight.float().abs().max() / 448
        tensors[f"{name}.weight"] = _fp8(weight, full)
        tensors[f"{name}.weight_scale"] = scale
        if layout == "static":
            tensors[f"{name}.input_scale"] = torch.tensor(1.0)  # ModelOpt's fixed amax 448
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = quant
    (out / "config.json").write_text(json.dumps(config))
    return out


def _edit(draft: Path, edit: Any) -> Path:
    tensors = load_file(str(draft / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(draft / "model.safetensors"), metadata={"format": "pt"})
    return draft


def _ranges(std: float) -> dict[str, LinearRange]:
    """Every decoder-layer linear as vLLM names it, having seen N(0, std) inputs."""
    generator = torch.Generator().manual_seed(5)
    ranges: dict[str, LinearRange] = {}
    for fused, parts in (("self_attn.qkv_proj", 3), ("self_attn.o_proj", 1)):
        ranges[f"model.layers.0.{fused}"] = _seen(std, parts, generator)
    for fused, parts in (("mlp.gate_up_proj", 2), ("mlp.down_proj", 1)):
        ranges[f"model.layers.0.{fused}"] = _seen(std, parts, generator)
    return ranges


def _seen(std: float, parts: int, generator: torch.Generator) -> LinearRange:
    values = torch.randn(20_000, generator=generator) * std
    histogram = Magnitudes()
    histogram.add(values)
    amax = float(values.abs().max())
    return {
        "calls": 4,
        "input_amax": amax,
        "output_amax": [1.0] * parts,
        "input_magnitudes": histogram.to_json(),
    }


def _check(draft: Path, baseline: Path, std: float = 3.0) -> tuple[list[str], dict[str, Any]]:
    inputs = PlausibilityInputs(
        target=baseline / "no-target-needed",
        draft=read_checkpoint(draft),
        baseline=read_checkpoint(baseline),
        prompts=[],
        generated=None,
        k=3,
        tolerance=ValidationSpec.scale_tolerance,
        capture=CaptureEngine(name="transformers"),
        engine_ranges=_ranges(std),
    )
    return plausibility_problems(inputs)


@pytest.mark.unit
def test_block_scales_dequantize_and_pass(tiny_draft: Path, tmp_path: Path) -> None:
    """FP8_BLOCK: [ceil(N/32), ceil(K/32)] scales, dynamic inputs (nothing to measure)."""
    draft = _draft(tiny_draft, tmp_path / "block", _block_config([32, 32]), "block")
    problems, numbers = _check(draft, tiny_draft)
    assert problems == []
    row = numbers["layers"][DOWN]
    assert row["weight"]["layout"] == "block 32x32" and row["input"] == "dynamic"
    assert row["weight"]["error"] < 1.05 * row["weight"]["calibrated_error"]  # as rounding goes
    assert "ranges_from" not in numbers  # no static input or K/V scale: nothing measured


@pytest.mark.unit
def test_one_block_scale_ten_times_too_large_fails_naming_the_weight(
    tiny_draft: Path, tmp_path: Path
) -> None:
    draft = _draft(tiny_draft, tmp_path / "block", _block_config([32, 32]), "block")
    _edit(draft, lambda t: t[f"{DOWN}.weight_scale"][0, 0].mul_(10))
    problems, _ = _check(draft, tiny_draft)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{DOWN}.weight (block 32x32 scales): relative error ")


@pytest.mark.unit
def test_block_scales_the_check_cannot_place_fail_closed_with_the_reason(
    tiny_draft: Path, tmp_path: Path
) -> None:
    """Scales whose shape fits neither the declared blocks nor any known layout: a FAIL that
    says so, never a crash (the block scales' former 'size of tensor a' error)."""
    draft = _draft(tiny_draft, tmp_path / "block", _block_config([32, 32]), "block")
    _edit(draft, lambda t: t.__setitem__(f"{DOWN}.weight_scale", torch.ones(45, 576)))
    problems, _ = _check(draft, tiny_draft)
    assert problems == [
        f"{DOWN}.weight_scale has shape [45, 576]; the config's 32x32 blocks of a [64, 128] "
        "weight need [2, 4]"
    ]


@pytest.mark.unit
def test_fixed_input_scales_of_one_pass_where_the_values_sit_in_the_normal_range(
    tiny_draft: Path, tmp_path: Path
) -> None:
    """ModelOpt's calibration-free draft (input_scale 1.0, amax 448) on inputs of |x| ~ 3:
    almost nothing below 2^-6, so it rounds as a calibrated scale would."""
    draft = _draft(tiny_draft, tmp_path / "modelopt", MODELOPT, "static")
    problems, numbers = _check(draft, tiny_draft)
    assert problems == [] and numbers["ranges_from"] == "engine"
    row = numbers["layers"][DOWN]["input"]
    assert row["scale"] == 1.0 and row["clipped"] == 0 and row["underflow"] < 0.01
    assert abs(row["sqnr_db"] - row["calibrated_sqnr_db"]) < 0.1


@pytest.mark.unit
def test_fixed_input_scales_fail_by_underflow_where_the_values_are_tiny(
    tiny_draft: Path, tmp_path: Path
) -> None:
    """The same draft on inputs of |x| ~ 1e-4: every value below 2^-6 x 1.0."""
    draft = _draft(tiny_draft, tmp_path / "modelopt", MODELOPT, "static")
    problems, numbers = _check(draft, tiny_draft, std=1e-4)
    assert len(problems) == len(MIDLAYER_LINEARS), problems
    assert all("underflow, 100.0% of the values below the smallest normal" in p for p in problems)
    assert numbers["layers"][DOWN]["input"]["cause"] == "underflow"


@pytest.mark.unit
def test_a_clipping_input_scale_and_a_missing_one_fail_naming_the_tensor(
    tiny_draft: Path, tmp_path: Path
) -> None:
    draft = _draft(tiny_draft, tmp_path / "modelopt", MODELOPT, "static")

    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors[f"{DOWN}.input_scale"] = torch.tensor(1e-3)
        del tensors["midlayer.self_attn.o_proj.input_scale"]

    clipping, missing = _check(_edit(draft, edit), tiny_draft)[0]
    assert missing == (
        "midlayer.self_attn.o_proj.input_scale is missing (vLLM would load its -3.4e38 "
        "placeholder silently)"
    )
    assert clipping.startswith(f"{DOWN}.input_scale = 0.001: clipping, ")
    assert "% of the tokens have values beyond +-448 x scale (" in clipping


@pytest.mark.unit
def test_a_draft_with_nothing_quantized_does_not_pass(tiny_draft: Path) -> None:
    problems, _ = _check(tiny_draft, tiny_draft)
    assert problems == ["the draft stores no quantized linear weight (nothing to judge)"]


@pytest.mark.unit
def test_an_unexpected_error_in_a_check_is_its_fail_and_bad_input_still_stops() -> None:
    """validate writes its report whatever a check raises: the check FAILs with the reason."""
    from eaglequant.errors import InputError
    from eaglequant.results.validation_report import CheckId
    from eaglequant.validate.validation import _fail_closed

    def crash() -> list[Any]:
        raise RuntimeError("The size of tensor a (45) must match the size of tensor b (576)")

    [check] = _fail_closed((CheckId.SCALES,), crash)
    assert not check.passed and check.name == CheckId.SCALES
    assert check.detail == (
        "could not be judged: unexpected RuntimeError: The size of tensor a (45) must match "
        "the size of tensor b (576)"
    )

    def bad_input() -> list[Any]:
        raise InputError("states: capture with --embeddings")

    with pytest.raises(InputError):
        _fail_closed((CheckId.SCALES,), bad_input)


@pytest.mark.unit
def test_the_engine_hooks_histograms_reach_check_6_by_checkpoint_name() -> None:
    """What validate's worker records on a fused qkv_proj (inputs, and the K and V parts of
    its output), through JSON, found again for the checkpoint's k_proj and v_proj."""
    from eaglequant.validate import draft_ranges
    from eaglequant.validate.plausibility import _engine_magnitudes

    layer = torch.nn.Linear(8, 4 + 2 + 2, bias=False)
    stats: dict[str, Any] = {}
    magnitudes: dict[str, Any] = {}
    name = "model.layers.0.self_attn.qkv_proj"
    handle = layer.register_forward_hook(draft_ranges._recorder(name, [4, 2, 2], stats, magnitudes))
    worker = type("Worker", (), {})()
    setattr(worker, draft_ranges.WATCH_ATTRIBUTE, ([handle], stats, magnitudes))
    x = torch.randn(5, 8)
    with torch.no_grad():
        out = layer(x)
    ranges = json.loads(json.dumps(draft_ranges.collect(worker)))
    linears = ["midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj"]
    measured = _engine_magnitudes(ranges, linears)
    assert not isinstance(measured, str), measured
    k, v = (measured.outputs[n] for n in linears)
    assert k["amax"] == pytest.approx(float(out[:, 4:6].abs().max()))
    assert v["amax"] == pytest.approx(float(out[:, 6:].abs().max()))
    assert measured.inputs[linears[0]]["amax"] == pytest.approx(float(x.abs().max()))
    assert measured.inputs[linears[0]]["rows"] == 5 and sum(k["count"]) == 10
