"""Each quantization method's rules: which draft linears vLLM builds how, from in-code configs."""

from __future__ import annotations

import pytest

from eaglequant.quantization import method_of
from eaglequant.quantization.base import block_refusal
from eaglequant.quantization.matching import modelopt_excluded
from eaglequant.rules.exclusions import predict_fates

QKV = "model.layers.4.self_attn.qkv_proj"
GATE_UP = "model.layers.4.mlp.gate_up_proj"


def fates(qcfg: dict) -> dict:
    return {f.vllm_name: f for f in predict_fates({"quantization_config": qcfg}, 4)}


def ct_config(ignore: list[str], weights: dict | None = None, inputs: dict | None = None) -> dict:
    w = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False}
    a = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "ignore": ignore,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": w | (weights or {}),
                "input_activations": None if inputs == {} else a | (inputs or {}),
            }
        },
    }


def modelopt_config(exclude: list[str], algo: str = "FP8", legacy: bool = False) -> dict:
    if legacy:
        return {
            "quant_method": "modelopt",
            "quantization": {"quant_algo": algo, "exclude_modules": exclude},
        }
    return {"quant_method": "modelopt", "quant_algo": algo, "ignore": exclude}


def test_compressed_tensors_dynamic_builds_every_linear_but_the_head_fp8() -> None:
    found = fates(ct_config(["lm_head", "re:.*fc.*", "re:.*embed_tokens.*"]))
    assert not found["model.fc"].quantized and not found["lm_head"].quantized
    for name in (QKV, GATE_UP, "model.layers.4.mlp.down_proj"):
        fate = found[name]
        assert fate.quantized and fate.vllm_scheme == "CompressedTensorsW8A8Fp8"
        assert fate.linear_method == "CompressedTensorsLinearMethod"
        assert fate.weight_dtype == "float8_e4m3fn" and not fate.static_input
        assert fate.scheme == "fp8 w:channel a:token dynamic"


def test_compressed_tensors_plain_fc_is_not_model_fc() -> None:
    found = fates(ct_config(["lm_head", "fc", "embed_tokens"]))
    assert found["model.fc"].quantized
    assert found["model.fc"].reason.startswith("target 'Linear'")


def test_compressed_tensors_linear_target_leaves_the_parallel_lm_head() -> None:
    found = fates(ct_config([]))
    assert not found["lm_head"].quantized
    assert found["lm_head"].reason == "no config_groups target matches it"
    named = ct_config([])
    named["config_groups"]["group_0"]["targets"] = ["Linear", "lm_head"]
    assert fates(named)["lm_head"].quantized


def test_compressed_tensors_static_and_weight_only_schemes() -> None:
    static = fates(ct_config([], {"strategy": "tensor"}, {"strategy": "tensor", "dynamic": False}))
    assert static[QKV].static_input and static[QKV].scheme == "fp8 w:tensor a:tensor static"
    token_static = fates(ct_config([], None, {"dynamic": False}))  # static per-token: not W8A8
    assert token_static[QKV].vllm_scheme == "CompressedTensorsW8A16Fp8"
    weight_only = fates(ct_config([], None, {}))
    assert weight_only[QKV].vllm_scheme == "CompressedTensorsW8A16Fp8"
    assert weight_only[QKV].scheme == "fp8 w:channel weight-only"


def test_compressed_tensors_block_weights_carry_their_block() -> None:
    found = fates(ct_config([], {"strategy": "block", "block_structure": [128, 128]}))
    assert found[QKV].block == (128, 128)
    assert found[QKV].scheme == "fp8 w:block 128x128 a:token dynamic"


def test_compressed_tensors_partial_shard_ignore_is_vllms_refusal() -> None:
    found = fates(ct_config(["re:.*q_proj"]))
    assert found[QKV].scheme == "error"
    assert found[QKV].reason.startswith("Found different quantization schemes for the shards")


def test_compressed_tensors_attention_only_group_is_dropped() -> None:
    qcfg = ct_config([])
    qcfg["config_groups"] = {
        "kv": qcfg["config_groups"]["group_0"] | {"targets": ["LlamaAttention"]}
    }
    assert not any(f.quantized for f in fates(qcfg).values())


def test_modelopt_matches_bare_fc_by_substring_and_quantizes_an_unlisted_head() -> None:
    found = fates(modelopt_config(["fc"]))
    assert not found["model.fc"].quantized
    assert found["lm_head"].quantized and found["lm_head"].linear_method == "ModelOptLinearMethod"
    declared = fates(modelopt_config(["*lm_head*", "*embed_tokens*"]))
    assert declared["model.fc"].quantized and declared["model.fc"].static_input
    assert not declared["lm_head"].quantized
    assert declared[QKV].built_as == "ModelOptLinearMethod"


def test_modelopt_reads_exclude_modules_only_in_its_legacy_section() -> None:
    legacy = fates(modelopt_config(["*fc*", "lm_head"], legacy=True))
    assert not legacy["model.fc"].quantized
    top = modelopt_config(["lm_head"]) | {"exclude_modules": ["*fc*"]}
    assert fates(top)["model.fc"].quantized  # vLLM reads 'ignore' here, not exclude_modules


def test_modelopt_per_channel_per_token_and_unknown_algorithms() -> None:
    pcpt = fates(modelopt_config(["lm_head"], "fp8_per_channel_per_token"))[QKV]
    assert pcpt.scheme == "fp8 w:per_channel a:per_token dynamic" and not pcpt.static_input
    refused = fates(modelopt_config([], "INT8_SQ"))[QKV]
    assert refused.scheme == "error"
    assert refused.reason.startswith("vLLM refuses it: ModelOpt currently only supports: ['FP8'")
    nvfp4 = fates(modelopt_config([], "NVFP4"))[QKV]
    assert nvfp4.scheme == "error" and "eaglequant does not predict" in nvfp4.reason


def test_modelopt_matching_rules() -> None:
    assert modelopt_excluded("model.layers.4.self_attn.qkv_proj", ["*self_attn*"], {})
    assert modelopt_excluded("model.fc", ["model.fc"], {})
    assert not modelopt_excluded("model.fc", ["lm_head"], {})


def test_fp8_ignored_layers_match_exact_vllm_names_only() -> None:
    qcfg = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["fc"]}
    found = fates(qcfg)
    assert found["model.fc"].quantized and found["model.fc"].linear_method == "Fp8LinearMethod"
    assert not found["lm_head"].quantized
    exact = fates(qcfg | {"ignored_layers": ["model.fc"]})
    assert not exact["model.fc"].quantized and exact[QKV].static_input


def test_fp8_block_and_its_refusals() -> None:
    block = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    assert fates(block)[QKV].block == (128, 128)
    static_block = fates(block | {"activation_scheme": "static"})[QKV]
    assert static_block.scheme == "error"
    assert "The block-wise quantization only supports dynamic activation scheme" in (
        static_block.reason
    )


def test_quark_is_unchanged_by_the_room() -> None:
    spec = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}
    qcfg = {
        "quant_method": "quark",
        "exclude": ["fc"],
        "global_quant_config": {"weight": spec, "input_tensors": spec},
        "export": {"kv_cache_group": []},
    }
    found = fates(qcfg)
    assert found["model.fc"].quantized and found["model.fc"].vllm_scheme == "QuarkW8A8Fp8"
    assert not found["lm_head"].quantized
    assert found[QKV].cpu == (
        "eaglequant's FP8 kernel on AVX512-BF16 CPUs, else vLLM's CPU FP8 GEMM over inputs "
        "quantized by eaglequant's plugin"
    )


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        (
            [576, 64, 64],
            "Weight output_partition_size = 576 is not divisible by weight "
            "quantization block_n = 128.",
        ),
        ([512, 128, 100], None),  # a merged layer's last shard may be ragged
        ([576], None),  # one unsplit output: no check at TP=1
        ([256, 256], None),
    ],
)
def test_block_refusal_is_vllms(sizes: list[int], expected: str | None) -> None:
    assert block_refusal((128, 128), sizes) == expected


def test_method_of_names_each_method() -> None:
    assert method_of({"quant_method": "modelopt"}).label == "NVIDIA ModelOpt"
    assert method_of({"quant_method": "gptq"}) is None
    assert method_of(None) is None
