"""Exclude rewriting and the prediction of how vLLM builds each draft linear."""

from __future__ import annotations

from eaglequant.rules.exclusions import (
    is_excluded,
    predict_fates,
    rewrite_exclude,
)


def quark_config(exclude: list[str], weight_scheme: str = "per_tensor") -> dict:
    spec = {"dtype": "fp8_e4m3", "qscheme": weight_scheme, "is_dynamic": False}
    return {
        "quantization_config": {
            "quant_method": "quark",
            "exclude": exclude,
            "global_quant_config": {
                "weight": spec,
                "input_tensors": {
                    "dtype": "fp8_e4m3",
                    "qscheme": "per_tensor",
                    "is_dynamic": False,
                },
                "output_tensors": None,
            },
            "layer_quant_config": {},
            "export": {"kv_cache_group": []},
        }
    }


def test_rewrite_uses_the_card_regexes_and_is_idempotent() -> None:
    once = rewrite_exclude(["fc", "lm_head"])
    assert once == ["re:.*fc.*", "re:.*lm_head.*"]
    assert rewrite_exclude(once) == once


def test_rewrite_anchors_other_names_and_maps_midlayer() -> None:
    rewritten = rewrite_exclude(["midlayer.mlp.down_proj", "*.o_proj", "re:keep.*"])
    assert rewritten[2] == "re:keep.*"
    assert is_excluded("model.layers.61.mlp.down_proj", rewritten)
    assert is_excluded("model.layers.61.self_attn.o_proj", rewritten)
    assert not is_excluded("model.layers.61.mlp.gate_up_proj", rewritten)
    assert rewrite_exclude(rewritten) == rewritten


def test_bare_fc_leaves_fc_quantized_regex_fixes_it() -> None:
    bare = {f.vllm_name: f for f in predict_fates(quark_config(["fc", "lm_head"]), 4)}
    assert bare["model.fc"].quantized
    assert not bare["lm_head"].quantized
    fixed = {
        f.vllm_name: f for f in predict_fates(quark_config(rewrite_exclude(["fc", "lm_head"])), 4)
    }
    assert not fixed["model.fc"].quantized
    for name in ("qkv_proj", "o_proj"):
        fate = fixed[f"model.layers.4.self_attn.{name}"]
        assert fate.quantized and fate.scheme == "fp8 w:per_tensor a:per_tensor static"


def test_partial_fused_exclusion_is_an_error_as_in_vllm() -> None:
    fates = {f.vllm_name: f for f in predict_fates(quark_config(["re:.*q_proj"]), 2)}
    assert fates["model.layers.2.self_attn.qkv_proj"].scheme == "error"
