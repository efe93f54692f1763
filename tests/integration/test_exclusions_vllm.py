"""Exclude rewriting and the prediction of how vLLM builds each draft linear."""

from __future__ import annotations

import pytest

from eaglequant.rules.exclusions import (
    is_excluded,
    vllm_linear_names,
)

EXCLUDE_CASES = [
    ["fc", "lm_head"],
    ["re:.*fc.*", "re:.*lm_head.*"],
    ["model.fc"],
    ["re:.*[qkv]_proj"],
    ["re:.*q_proj", "re:.*k_proj", "re:.*v_proj"],
    ["re:model\\.layers\\.\\d+\\.mlp\\..*"],
    ["model.layers.3.mlp.gate_proj", "model.layers.3.mlp.up_proj"],
    ["re:.*qkv_proj.*"],
    [],
]


@pytest.mark.parametrize("exclude", EXCLUDE_CASES)
def test_prediction_agrees_with_vllm_should_ignore_layer(exclude: list[str]) -> None:
    utils = pytest.importorskip("vllm.model_executor.layers.quantization.quark.utils")
    fused = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    for name in vllm_linear_names(3):
        if name == "lm_head":
            continue
        assert is_excluded(name, exclude) == utils.should_ignore_layer(
            name, ignore=exclude, fused_mapping=fused
        ), (name, exclude)
