"""The speculators draft format: read as vLLM reads it, exported in the same format.

Drafts are made in code: the same tensors written in the EAGLE-3 layout and in the
speculators layout (``layers.0.*``, nested config), so every difference between
the two exports is the format's and nothing else.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from eaglequant.io import speculators
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.conftest import edit_config
from tests.support import invoke

VARIANTS = [
    {},
    {"norm_before_residual": None},  # absent: vLLM takes true
    {"norm_output": True, "target_hidden_size": 96},
    {"eagle_aux_hidden_state_layer_ids": None},
]


@pytest.mark.parametrize("change", VARIANTS)
def test_flat_config_is_the_one_vllm_builds(tmp_path: Path, change: dict[str, Any]) -> None:
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    folder = write_random_draft(tmp_path / "s", draft_config(), speculators_verifier="t")
    edit_config(folder, **change)
    stored = json.loads((folder / "config.json").read_text())
    theirs = SpeculatorsConfig.extract_transformers_pre_trained_config(copy.deepcopy(stored))
    assert read_checkpoint(folder).config == theirs
    assert speculators.flat_config(stored) == theirs


def test_qwen3_layer_config_maps_to_vllms_qwen3_draft(tmp_path: Path) -> None:
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    config = draft_config(architectures=["Eagle3Qwen3ForCausalLM"], model_type="qwen3")
    folder = write_random_draft(tmp_path / "s", config, speculators_verifier="t")
    stored = json.loads((folder / "config.json").read_text())
    assert stored["transformer_layer_config"]["architectures"] == ["Qwen3ForCausalLM"]
    ckpt = read_checkpoint(folder)
    theirs = SpeculatorsConfig.extract_transformers_pre_trained_config(copy.deepcopy(stored))
    assert ckpt.config == theirs and theirs["architectures"] == ["Eagle3Qwen3ForCausalLM"]
    code, output = invoke(["inspect", str(folder), "--json"])
    assert code == 0, output
    assert json.loads(output)["form"] == "speculators format, EAGLE-3 Qwen3"


@pytest.mark.parametrize("where", ["top", "layer", "both"])
def test_quantization_config_is_read_where_vllm_reads_it(tmp_path: Path, where: str) -> None:
    """vLLM's get_config: the top-level quantization_config if any, else the layer config's."""
    from vllm.transformers_utils.config import get_config

    folder = write_random_draft(tmp_path / "s", draft_config(), speculators_verifier="t")
    stored = json.loads((folder / "config.json").read_text())
    top, layer = {"quant_method": "quark", "exclude": ["top"]}, {"quant_method": "quark"}
    if where in ("top", "both"):
        stored["quantization_config"] = top
    if where in ("layer", "both"):
        stored["transformer_layer_config"]["quantization_config"] = layer | {"exclude": ["layer"]}
    (folder / "config.json").write_text(json.dumps(stored))
    theirs = get_config(str(folder), trust_remote_code=False).quantization_config
    ours = read_checkpoint(folder).config["quantization_config"]
    assert ours["exclude"] == theirs["exclude"] == (["layer"] if where == "layer" else ["top"])
