"""Checks 3 and 4 never pass on nothing: no draft model layers, no scales, no K/V layers, no log."""

from __future__ import annotations

from typing import Any

from eaglequant.validate.layers import ExpectedLayers, kv_cache_problems, layers_check, log_check

EXPECTED = ExpectedLayers(
    {
        "self_attn.qkv_proj": "QuarkW8A8Fp8",
        "self_attn.o_proj": "QuarkW8A8Fp8",
        "mlp.gate_up_proj": "QuarkW8A8Fp8",
        "mlp.down_proj": "QuarkW8A8Fp8",
    }
)
SCALE = {"dtype": "float32", "count": 1, "min": 0.01, "max": 0.01, "finite_positive": True}


def _layer(name: str, fp8: bool, scales: bool = True) -> dict[str, Any]:
    layer: dict[str, Any] = {
        "name": name,
        "module": "Linear",
        "quant_method": "QuarkLinearMethod" if fp8 else "UnquantizedLinearMethod",
        "scheme": "QuarkW8A8Fp8" if fp8 else None,
        "weight_dtype": "float8_e4m3fn" if fp8 else "bfloat16",
    }
    if fp8 and scales:
        layer |= {"weight_scale": SCALE, "input_scale": SCALE}
    return layer


def _drafter(scales: bool = True) -> list[Any]:
    inner = [_layer(f"model.layers.4.{w}", True, scales) for w in EXPECTED.schemes]
    return [_layer("model.fc", False), *inner, _layer("lm_head", False)]


def test_a_full_drafter_passes_check_3() -> None:
    check = layers_check(_drafter(), EXPECTED)
    assert check.passed, check.detail


def test_no_drafter_layers_fail_check_3() -> None:
    check = layers_check([], EXPECTED)
    assert not check.passed
    assert "vLLM reported no draft model linear layer (nothing observed)" in check.detail


def test_a_missing_draft_linear_fails_check_3() -> None:
    layers = [layer for layer in _drafter() if not layer["name"].endswith("o_proj")]
    check = layers_check(layers, EXPECTED)
    assert not check.passed
    assert check.detail == "vLLM reported no self_attn.o_proj in any draft layer"


def test_quantized_linears_without_any_scale_fail_check_3() -> None:
    check = layers_check(_drafter(scales=False), EXPECTED)
    assert not check.passed
    assert check.detail == (
        "vLLM reported no weight or input scale on any of the 4 quantized draft linears "
        "(nothing observed)"
    )


def test_kv_scales_with_no_attention_layer_observed_are_a_problem() -> None:
    problems, _ = kv_cache_problems([], [(0.25, 0.5)])
    assert problems == [
        "vLLM reported no draft model attention layer for the checkpoint's 1 K/V scale pair(s)"
    ]
    assert not layers_check(_drafter(), EXPECTED, kv_cache=([], [(0.25, 0.5)])).passed


def test_an_empty_engine_log_fails_check_4() -> None:
    assert not log_check("").passed
    assert not log_check("  \n").passed
    assert log_check("INFO engine started\n").passed
