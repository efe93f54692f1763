"""Each quantization method's rules held to the installed vLLM's own functions.

Not collected by the suite itself (importing vLLM's ModelOpt, fp8 and compressed-tensors
configs loads its kernel library, which the test process never does):
``tests/integration/test_quantization_vllm.py`` runs these tests in a child pytest session.

Where vLLM's matching can be called without an engine it is called: Quark's and
compressed-tensors' ``should_ignore_layer``, compressed-tensors' ``find_matched_target`` (with
modules of vLLM's class names) and its W8A8 FP8 predicate, ModelOpt's ``is_layer_excluded`` and
``fp8``'s ``is_layer_skipped`` on configs built by each method's ``from_config``, and the FP8
block-shape validation. compressed-tensors' own ``QuantizationConfig`` parses what the core
reads by hand.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest
import torch

from eaglequant.quantization.base import block_refusal, module_class
from eaglequant.quantization.compressed_tensors import METHOD as CT
from eaglequant.quantization.compressed_tensors import target_scheme_map
from eaglequant.quantization.fp8 import METHOD as FP8
from eaglequant.quantization.modelopt import METHOD as MODELOPT
from eaglequant.quantization.quark import METHOD as QUARK
from eaglequant.rules.exclusions import predict_fates, vllm_linear_names
from tests.foreign import compressed_tensors_config, fp8_args

FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
NAMES = list(vllm_linear_names(3))
ENTRY_LISTS = [
    ["fc", "lm_head"],
    ["re:.*fc.*", "re:.*lm_head.*"],
    ["model.fc", "lm_head"],
    ["*fc*", "*lm_head*", "*embed_tokens*"],
    ["fc*", "model.layers.3.mlp*"],
    ["re:.*[qkv]_proj"],
    ["re:.*q_proj", "re:.*k_proj", "re:.*v_proj"],
    ["model.layers.3.self_attn.q_proj", "model.layers.3.self_attn.k_proj"],
    ["model.layers.3.mlp.gate_proj", "model.layers.3.mlp.up_proj"],
    ["re:.*qkv_proj.*", "self_attn"],
    ["mlp", "lm_head"],
    [],
]


def _outcome(call: Callable[..., object], *args: object, **kwargs: object) -> bool | str:
    """What a matching function says of one name: matched or not, or refused (ValueError)."""
    try:
        return bool(call(*args, **kwargs))
    except ValueError:
        return "refused"


@pytest.mark.parametrize("entries", ENTRY_LISTS)
def test_quark_and_compressed_tensors_ignore_match_as_vllm(entries: list[str]) -> None:
    from vllm.model_executor.layers.quantization.compressed_tensors import utils as ct_utils
    from vllm.model_executor.layers.quantization.quark import utils as quark_utils

    for name in NAMES:
        theirs = _outcome(quark_utils.should_ignore_layer, name, entries, FUSED)
        assert _outcome(QUARK.excluded, name, entries) == theirs, (name, entries)
        theirs = _outcome(ct_utils.should_ignore_layer, name, entries, FUSED)
        assert _outcome(CT.excluded, name, entries) == theirs, (name, entries)


@pytest.mark.parametrize("entries", ENTRY_LISTS)
def test_modelopt_exclusions_match_as_vllm(entries: list[str]) -> None:
    from vllm.model_executor.layers.quantization.modelopt import ModelOptFp8Config

    config = ModelOptFp8Config.from_config(
        {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": entries}
    )
    config.packed_modules_mapping = FUSED
    for name in NAMES:
        theirs = _outcome(config.is_layer_excluded, name)
        assert _outcome(MODELOPT.excluded, name, entries) == theirs, (name, entries)


@pytest.mark.parametrize("entries", ENTRY_LISTS)
def test_fp8_ignored_layers_match_as_vllm(entries: list[str]) -> None:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

    config = Fp8Config.from_config(
        {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": entries}
    )
    for name in NAMES:
        mode = config.ignored_layers_match_mode
        theirs = _outcome(is_layer_skipped, name, config.ignored_layers, FUSED, match_mode=mode)
        assert _outcome(FP8.excluded, name, entries) == theirs, (name, entries)


def test_modelopt_algorithms_are_vllms() -> None:
    from vllm.model_executor.layers.quantization import modelopt

    from eaglequant.quantization.modelopt import ALGOS, VLLM_QUANT_ALGOS

    assert list(ALGOS) == list(modelopt.algos_owned_by("modelopt"))
    assert VLLM_QUANT_ALGOS == modelopt.QUANT_ALGOS


def test_modelopt_reads_the_key_vllm_reads() -> None:
    from vllm.model_executor.layers.quantization.modelopt import ModelOptFp8Config

    top = {
        "quant_method": "modelopt",
        "quant_algo": "FP8",
        "ignore": ["a"],
        "exclude_modules": ["b"],
    }
    legacy = {
        "quant_method": "modelopt",
        "quantization": {"quant_algo": "FP8", "exclude_modules": ["c"]},
    }
    for qcfg in (top, legacy):
        assert ModelOptFp8Config.from_config(qcfg).exclude_modules == MODELOPT.exclusions(qcfg)


def test_fp8_reads_modules_to_not_convert_when_ignored_layers_is_empty() -> None:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    qcfg = {"quant_method": "fp8", "activation_scheme": "static", "modules_to_not_convert": ["x"]}
    assert Fp8Config.from_config(qcfg).ignored_layers == FP8.exclusions(qcfg) == ["x"]


@pytest.mark.parametrize(
    ("qcfg", "cls"),
    [
        ({"quant_method": "modelopt", "quant_algo": "INT8_SQ"}, "modelopt"),
        ({"quant_method": "modelopt"}, "modelopt"),
        (
            {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
            "fp8",
        ),
        (
            {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128]},
            "fp8",
        ),
    ],
)
def test_config_refusals_are_vllms_words(qcfg: dict, cls: str) -> None:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.model_executor.layers.quantization.modelopt import ModelOptFp8Config

    config_class = ModelOptFp8Config if cls == "modelopt" else Fp8Config
    with pytest.raises(ValueError) as refused:
        config_class.from_config(qcfg)
    method = MODELOPT if cls == "modelopt" else FP8
    (message, _fix), *_ = method.config_problems(qcfg)
    assert message == f"vLLM refuses it: {refused.value}"


TARGET_LISTS = [
    ["Linear"],
    ["Linear", "lm_head"],
    ["re:.*self_attn.*"],
    ["re:.*q_proj", "re:.*k_proj", "re:.*v_proj"],
    ["model.layers.3.mlp.down_proj", "model.fc"],
    ["ParallelLMHead"],
]


@pytest.mark.parametrize("targets", TARGET_LISTS)
def test_compressed_tensors_targets_match_as_vllm(targets: list[str]) -> None:
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import (
        find_matched_target,
    )

    from eaglequant.quantization.matching import find_matched_target as ours

    for name in NAMES:
        module = type(module_class(name), (torch.nn.Module,), {})()
        theirs = find_matched_target(name, module, targets, FUSED)
        assert ours(name, module_class(name), targets, CT_FUSED) == theirs, (name, targets)


CT_FUSED = {k: tuple(v) for k, v in FUSED.items()}


def test_module_classes_are_vllms() -> None:
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    for name in NAMES:
        found = getattr(linear, module_class(name), None) or (
            ParallelLMHead if module_class(name) == "ParallelLMHead" else None
        )
        assert found is not None, module_class(name)
    assert issubclass(linear.QKVParallelLinear, linear.LinearBase)
    assert not issubclass(ParallelLMHead, linear.LinearBase)


SCHEMES = [
    (fp8_args("channel", False), fp8_args("token", True)),  # FP8_DYNAMIC
    (fp8_args("tensor", False), fp8_args("tensor", False)),  # FP8 static
    (fp8_args("channel", False), fp8_args("tensor", False)),
    (fp8_args("block", False, block_structure=[128, 128]), fp8_args("group", True, group_size=128)),
    (fp8_args("channel", False), None),  # weight-only
]


@pytest.mark.parametrize(("weights", "inputs"), SCHEMES)
def test_compressed_tensors_schemes_are_read_as_the_library_and_vllm_read_them(
    weights: dict, inputs: dict | None
) -> None:
    from compressed_tensors.quantization import QuantizationConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    qcfg = compressed_tensors_config(["lm_head"], weights, inputs)
    group = QuantizationConfig.model_validate(qcfg).config_groups["group_0"]
    mine = target_scheme_map(qcfg)["Linear"]
    assert mine.weights is not None
    strategy = group.weights.strategy  # the library's enum, or its value as stored
    assert mine.weights.strategy == getattr(strategy, "value", strategy)
    assert bool(mine.weights.dynamic) == bool(group.weights.dynamic)
    assert mine.weights.block == (tuple(group.weights.block_structure or ()) or None)
    w8a8 = CompressedTensorsConfig._is_fp8_w8a8(group.weights, group.input_activations)
    fate = {f.vllm_name: f for f in predict_fates({"quantization_config": qcfg}, 3)}
    qkv = fate["model.layers.3.self_attn.qkv_proj"]
    assert (qkv.vllm_scheme == "CompressedTensorsW8A8Fp8") == w8a8
    if inputs is not None and not w8a8:
        assert qkv.vllm_scheme == "CompressedTensorsW8A16Fp8"
    theirs = CompressedTensorsConfig.from_config(qcfg)
    layer = type("QKVParallelLinear", (torch.nn.Module,), {})()
    scheme = theirs.get_scheme_dict(layer, "model.layers.3.self_attn.qkv_proj")
    assert scheme is not None and scheme["weights"] == group.weights


@pytest.mark.parametrize(
    "sizes", [[576, 64, 64], [512, 128, 100], [576], [256, 256], [384, 128, 128], [64, 32, 32]]
)
@pytest.mark.parametrize("block", [(128, 128), (64, 64), (16, 16)])
def test_block_refusal_is_vllms_validation(
    monkeypatch: pytest.MonkeyPatch, sizes: list[int], block: tuple[int, int]
) -> None:
    import vllm.distributed
    from vllm.model_executor.layers.quantization.utils.fp8_utils import validate_fp8_block_shape

    monkeypatch.setattr(vllm.distributed, "get_tensor_model_parallel_world_size", lambda: 1)
    layer = types.SimpleNamespace(tp_size=1)
    try:
        validate_fp8_block_shape(layer, 1024, sum(sizes), 1024, sizes, list(block))
        theirs = None
    except ValueError as exc:
        theirs = str(exc)
    assert block_refusal(block, sizes) == theirs
