"""OCP MX and per-channel static recipes: loading, refusals, the layout on disk, MX arithmetic,
the fate prediction and the size summary (no Quark, no vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglequant.errors import InputError
from eaglequant.model import mx
from eaglequant.quantize.artifact import quantized_layout
from eaglequant.recipe import load_recipe, recipe_from_dict
from eaglequant.rules.exclusions import describe_scheme, vllm_scheme

MX_WEIGHT = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"}
MX8_WEIGHT = {**MX_WEIGHT, "dtype": "fp8_e4m3"}
STATIC_FP8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False, "symmetric": True}
CHANNEL_FP8 = {**STATIC_FP8, "qscheme": "per_channel"}
MX8_DYNAMIC = {**MX8_WEIGHT, "is_dynamic": True}


@pytest.mark.parametrize(
    ("name", "scheme", "calibrated"),
    [
        ("mxfp8", "W mxfp8_e4m3 per 32 / A mxfp8_e4m3 per 32 dynamic", False),
        ("mxfp4", "W mxfp4 per 32 / A mxfp4 per 32 dynamic", False),
        ("mxfp4-fp8", "W mxfp4 per 32 / A fp8_e4m3 per_tensor static", True),
        ("fp8-static-channel", "W fp8_e4m3 per_channel / A fp8_e4m3 per_tensor static", True),
        ("fp8-static-fixed", "W fp8_e4m3 per_tensor / A fp8_e4m3 per_tensor static", True),
    ],
)
def test_builtin_format_recipes(name: str, scheme: str, calibrated: bool) -> None:
    recipe = load_recipe(name)
    assert recipe.scheme() == scheme
    assert recipe.needs_calibration is calibrated
    assert not recipe.direct_flow  # Quark's module flow: its direct flow has no per-group FP8


def test_the_calibration_free_recipe_is_fixed_at_448_and_refuses_what_it_cannot_fix() -> None:
    fixed = load_recipe("fp8-static-fixed")
    assert fixed.calibration.fixed and fixed.calibration.fixed_input_amax == 448.0
    for extra in (
        {"activation": {"granularity": "per_token", "dynamic": True}},  # nothing static to fix
        {"kv_cache": {"dtype": "fp8_e4m3"}},  # K/V scales are calibrated with the inputs'
    ):
        with pytest.raises(InputError, match="'calibration.fixed: true' fixes static input"):
            recipe_from_dict({"name": "x", "calibration": {"fixed": True}, **extra}, "origin")


@pytest.mark.parametrize(
    ("weight", "activation", "message"),
    [
        (
            {"dtype": "mxfp8_e4m3", "granularity": "per_group"},
            {"granularity": "per_tensor", "dynamic": False},
            "origin: 'weight.dtype: mxfp8_e4m3' with static FP8 inputs: vLLM refuses it "
            '("Quark model\'s OCP MX quantization is incompatible with static input scales"); '
            "use 'activation.dynamic: true' or 'weight.dtype: mxfp4' (its W4A8 scheme)",
        ),
        (
            {"dtype": "mxfp8_e4m3", "granularity": "per_group"},
            {"dtype": "mxfp4", "granularity": "per_group", "dynamic": True},
            "origin: 'activation.dtype: mxfp4' needs 'weight.dtype: mxfp4'; vLLM's QuarkOCP_MX "
            "pairs OCP MX inputs with weights of the same dtype only",
        ),
        (
            {"dtype": "mxfp4", "granularity": "per_channel"},
            {"granularity": "per_token", "dynamic": True},
            "origin: 'weight.granularity: per_group' goes with an OCP MX dtype (mxfp8_e4m3, "
            "mxfp4) and only with one, got dtype 'mxfp4' and granularity 'per_channel'",
        ),
        (
            {"dtype": "mxfp4", "granularity": "per_group"},
            {"dtype": "mxfp4", "granularity": "per_group", "dynamic": False},
            "origin: 'activation.dtype: mxfp4' requires 'dynamic: true' (vLLM computes OCP MX "
            "input scales on the fly; it refuses static ones)",
        ),
    ],
)
def test_what_vllm_cannot_load_is_refused(
    weight: dict[str, str], activation: dict[str, object], message: str
) -> None:
    with pytest.raises(InputError) as caught:
        recipe_from_dict({"name": "x", "weight": weight, "activation": activation}, "origin")
    assert str(caught.value) == message


def test_layout_on_disk() -> None:
    assert quantized_layout(load_recipe("mxfp4"), (96, 512)) == ("U8", (96, 256), "U8", (96, 16))
    mxfp8 = quantized_layout(load_recipe("mxfp8"), (96, 512))
    assert mxfp8 == ("F8_E4M3", (96, 512), "U8", (96, 16))
    channel = quantized_layout(load_recipe("fp8-static-channel"), (96, 512))
    assert channel == ("F8_E4M3", (96, 512), "F32", (96,))
    assert quantized_layout(load_recipe("fp8-static"), (96, 512))[3] == ()


def test_fp4_unpacks_low_nibble_first() -> None:
    packed = torch.tensor([[0x21, 0xF7]], dtype=torch.uint8)  # 1=0.5, 2=1.0, 7=6.0, F=-6.0
    assert mx.unpack_fp4(packed).tolist() == [[0.5, 1.0, 6.0, -6.0]]


def test_dequantize_applies_one_scale_per_32() -> None:
    values = torch.arange(64, dtype=torch.float32).remainder(8).view(1, 64)  # exact in E4M3
    exponents = torch.tensor([[127, 130]], dtype=torch.uint8)  # 1 and 8
    got = mx.dequantize(values.to(torch.float8_e4m3fn), exponents, "mxfp8_e4m3")
    assert torch.equal(got[0, :32], values[0, :32]) and torch.equal(got[0, 32:], values[0, 32:] * 8)
    assert torch.isnan(mx.block_scales(torch.tensor([255], dtype=torch.uint8))).all()


@pytest.mark.parametrize("dtype", ["mxfp4", "mxfp8_e4m3"])
def test_qdq_keeps_representable_blocks_and_bounds_the_error(dtype: str) -> None:
    grid = torch.tensor(mx.FP4_E2M1_VALUES).repeat(4).view(1, 32) * 4  # amax 24 = 6 x 4
    assert torch.equal(mx.quantize_dequantize(grid, dtype), grid)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    error = (mx.quantize_dequantize(x, dtype) - x).abs().max()
    assert 0 < error <= (0.5 if dtype == "mxfp4" else 0.07) * x.abs().max()


@pytest.mark.parametrize(
    ("weight", "inputs", "scheme", "described"),
    [
        (MX_WEIGHT, {**MX_WEIGHT, "is_dynamic": True}, "QuarkOCP_MX", "mxfp4 a:mxfp4 dynamic"),
        (MX8_WEIGHT, MX8_DYNAMIC, "QuarkOCP_MX", "mxfp8_e4m3 a:mxfp8_e4m3 dynamic"),
        (MX_WEIGHT, STATIC_FP8, "QuarkW4A8_MXFP4_FP8", "mxfp4 a:fp8 per_tensor static"),
        (MX8_WEIGHT, STATIC_FP8, None, "mxfp8_e4m3 a:fp8 per_tensor static"),
        (CHANNEL_FP8, STATIC_FP8, "QuarkW8A8Fp8", "fp8 w:per_channel a:per_tensor static"),
    ],
)
def test_predicted_vllm_scheme(
    weight: dict[str, object], inputs: dict[str, object], scheme: str | None, described: str
) -> None:
    layer = {"weight": weight, "input_tensors": inputs}
    assert vllm_scheme(layer) == scheme
    assert describe_scheme(layer) == described


def test_size_summary_counts_packed_fp4_twice(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from eaglequant.io.checkpoint import read_checkpoint
    from eaglequant.rules.inspection import size_summary

    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    tensors = {
        "fc.weight": torch.zeros(4, 8, dtype=torch.bfloat16),
        "midlayer.mlp.down_proj.weight": torch.zeros(4, 16, dtype=torch.uint8),
        "midlayer.mlp.down_proj.weight_scale": torch.zeros(4, 1, dtype=torch.uint8),
    }
    save_file(tensors, str(folder / "model.safetensors"))
    size = size_summary(read_checkpoint(folder))
    assert (size.parameters, size.quantized_parameters) == (32 + 128, 128)
    assert size.bytes_on_disk == 64 + 64 + 4
    assert size.quantized_fraction == pytest.approx(0.8)
