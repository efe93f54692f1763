"""Check 3 judges a draft against what it declares and stores, by its own method's rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.results.manifest import MANIFEST_FILE
from eaglequant.validate.layers import expected_schemes, layers_check
from tests.foreign import MIDLAYER, fp8_dynamic_draft, modelopt_fp8_draft, quantize_layers
from tests.foreign import set_quantization_config as set_qcfg

SCALE = {"dtype": "float32", "count": 1, "min": 0.01, "max": 0.01, "finite_positive": True}
WITHIN = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def built(name: str, method: str, scheme: str | None = None) -> dict[str, Any]:
    """One linear as vLLM reports it (the engine's module tree: model.layers.0 …)."""
    quantized = not method.startswith("Unquantized")
    layer: dict[str, Any] = {
        "name": name,
        "module": "Linear",
        "quant_method": method,
        "scheme": scheme,
        "weight_dtype": "float8_e4m3fn" if quantized else "bfloat16",
    }
    return layer | ({"weight_scale": SCALE} if quantized else {})


def drafter(method: str, scheme: str | None, fc: str = "UnquantizedLinearMethod") -> list[Any]:
    inner = [built(f"model.layers.0.{w}", method, scheme) for w in WITHIN]
    fc_layer = built("model.fc", fc, scheme if fc == method else None)
    return [fc_layer, *inner, built("lm_head", "UnquantizedLinearMethod")]


def quark_draft(folder: Path, exclude: list[str]) -> Path:
    quantize_layers(folder, MIDLAYER, static_input=True)
    spec = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}
    set_qcfg(
        folder,
        {
            "quant_method": "quark",
            "exclude": exclude,
            "global_quant_config": {"weight": spec, "input_tensors": spec},
            "export": {"kv_cache_group": []},
        },
    )
    return folder


def test_compressed_tensors_layers_built_as_declared_pass(tiny_draft: Path) -> None:
    expected = expected_schemes(read_checkpoint(fp8_dynamic_draft(tiny_draft)))
    layers = drafter("CompressedTensorsLinearMethod", "CompressedTensorsW8A8Fp8")
    check = layers_check(layers, expected)
    assert check.passed, check.detail
    assert check.detail == (
        "fc, lm_head unquantized; every draft layer's projections CompressedTensorsW8A8Fp8 with "
        "finite positive scales"
    )


def test_modelopt_quantized_fc_is_a_fact_not_a_failure(tiny_draft: Path) -> None:
    expected = expected_schemes(read_checkpoint(modelopt_fp8_draft(tiny_draft)))
    layers = drafter("ModelOptLinearMethod", None, fc="ModelOptLinearMethod")
    check = layers_check(layers, expected)
    assert check.passed, check.detail
    assert check.detail == (
        "lm_head unquantized; fc: FP8, as declared (ModelOptLinearMethod); every draft layer's "
        "projections ModelOptLinearMethod with finite positive scales"
    )


def test_the_seeds_bare_fc_exclude_still_fails(tiny_draft: Path) -> None:
    expected = expected_schemes(read_checkpoint(quark_draft(tiny_draft, ["fc", "lm_head"])))
    layers = drafter("QuarkLinearMethod", "QuarkW8A8Fp8", fc="QuarkLinearMethod")
    check = layers_check(layers, expected)
    assert not check.passed
    assert check.detail == (
        "model.fc built with float8_e4m3fn weights but the checkpoint stores them as BF16: vLLM "
        "cast the BF16 weight into a quantized layer"
    )


def test_a_layer_built_other_than_declared_fails(tiny_draft: Path) -> None:
    expected = expected_schemes(read_checkpoint(fp8_dynamic_draft(tiny_draft)))
    layers = drafter("CompressedTensorsLinearMethod", "CompressedTensorsW8A16Fp8")
    check = layers_check(layers, expected)
    assert not check.passed
    assert check.detail.startswith(
        "model.layers.0.self_attn.qkv_proj built as CompressedTensorsW8A16Fp8 (float8_e4m3fn), "
        "expected CompressedTensorsW8A8Fp8"
    )


def test_eaglequants_own_export_keeps_fc_bf16(tiny_draft: Path) -> None:
    modelopt_fp8_draft(tiny_draft)
    (tiny_draft / MANIFEST_FILE).write_text(json.dumps({"tool": "eaglequant"}))
    expected = expected_schemes(read_checkpoint(tiny_draft))
    check = layers_check(drafter("ModelOptLinearMethod", None, fc="ModelOptLinearMethod"), expected)
    assert not check.passed
    assert check.detail == (
        "model.fc built as ModelOptLinearMethod: eaglequant's recipe keeps fc and lm_head BF16"
    )
