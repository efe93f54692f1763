"""MLA EAGLE-3 drafts (vLLM's deepseek_eagle3.py): recognised, named, and refused with reasons.

The module-vs-vLLM proof and the real engine's layer check are in
tests/engine/test_draft_equivalence.py; the tensor-by-tensor export in
tests/unit/test_draft_forms.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eaglequant.cli import main
from eaglequant.forms.mla import DEFAULTS, Rope, rope_from_config
from eaglequant.rules.draft import dims_from_config
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.conftest import MLA, MLA_YARN, edit_config, tree_digest
from tests.support import fates_by_name, inspect_json


def test_defaults_are_deepseek_v2_configs(tmp_path: Path) -> None:
    """What vLLM reads for an absent key is transformers' DeepseekV2Config default."""
    from transformers import DeepseekV2Config

    reference = DeepseekV2Config()
    assert {key: getattr(reference, key) for key in DEFAULTS} == DEFAULTS
    config = {k: v for k, v in draft_config(**MLA).items() if k != "q_lora_rank"}
    mla = dims_from_config(config).mla
    assert mla is not None and mla.q_lora_rank == 1536


def test_rope_read_as_transformers_standardises_it() -> None:
    """A legacy ``rope_scaling``/``rope_theta`` config gives the same RoPE as the
    ``rope_parameters`` that transformers (and so vLLM) makes of it."""
    from transformers import DeepseekV2Config

    legacy_scaling = {k: v for k, v in MLA_YARN.items() if k not in ("rope_type", "rope_theta")}
    legacy = {"rope_scaling": {"type": "yarn", **legacy_scaling}, "rope_theta": 50000.0}
    standard = DeepseekV2Config(**legacy).rope_parameters
    assert rope_from_config(legacy, "c") == rope_from_config({"rope_parameters": standard}, "c")
    assert rope_from_config(legacy, "c") == Rope(
        theta=50000.0,
        factor=4.0,
        original_max_position=512,
        mscale=1.0,
        mscale_all_dim=0.5,
        scale_softmax=True,
    )


def test_inspect_names_every_mla_linear_with_vllms_fate(mla_draft: Path) -> None:
    """vLLM fuses q_a_proj and kv_a_proj_with_mqa into fused_qkv_a_proj (one fate)."""
    code, report = inspect_json(mla_draft)
    assert code == 0, report
    assert report["form"] == "EAGLE-3 MLA (DeepSeek-V2 attention)"
    assert report["dims"]["mla"]["kv_lora_rank"] == 48
    attn = "midlayer.self_attn"
    assert {n: c for n, (c, _, _) in fates_by_name(report).items()} == {
        "model.layers.4.self_attn.fused_qkv_a_proj": [
            f"{attn}.q_a_proj",
            f"{attn}.kv_a_proj_with_mqa",
        ],
        "model.layers.4.self_attn.q_b_proj": [f"{attn}.q_b_proj"],
        "model.layers.4.self_attn.kv_b_proj": [f"{attn}.kv_b_proj"],
        "model.layers.4.self_attn.o_proj": [f"{attn}.o_proj"],
        "model.layers.4.mlp.gate_up_proj": ["midlayer.mlp.gate_proj", "midlayer.mlp.up_proj"],
        "model.layers.4.mlp.down_proj": ["midlayer.mlp.down_proj"],
        "model.fc": ["fc"],
        "lm_head": ["lm_head"],
    }


def test_an_mla_draft_without_q_lora_is_refused_with_vllms_load_error(mla_draft: Path) -> None:
    """q_lora_rank null: vLLM builds q_proj and kv_a_proj_with_mqa but renames the latter's
    weight to fused_qkv_a_proj, and its loader fails (seen with a real engine)."""
    path = mla_draft / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"q_lora_rank": None}))
    code, report = inspect_json(mla_draft)
    assert code == 1 and report["form"] == "unrecognised"
    assert report["problems"] == [
        f"{path}: q_lora_rank is null: vLLM 0.32's MLA draft model then builds q_proj and "
        "kv_a_proj_with_mqa, but its weight mapper renames kv_a_proj_with_mqa to "
        "fused_qkv_a_proj, so loading fails (no module or parameter named "
        "'layers.0.self_attn.fused_qkv_a_proj'); serve an MLA draft with q LoRA (q_a_proj, "
        "q_a_layernorm, q_b_proj)"
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "deepseek_v3"}, "set model_type to 'deepseek_v2'"),
        ({"hidden_act": "gelu"}, "vLLM's DeepseekV2MLP supports only silu"),
        ({"norm_before_fc": True}, "'norm_before_fc' is set, but vLLM's MLA draft model"),
        ({"attention_bias": True}, "'attention_bias' is set, but vLLM's MLA draft model"),
        (
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0}},
            "rope type 'linear' in an MLA draft is not handled yet",
        ),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
            "rope type 'default' in an MLA draft is not handled yet",
        ),
        ({"kv_lora_rank": 0}, "'kv_lora_rank' must be a positive integer, got 0"),
        (
            {"num_hidden_layers": 2},
            "num_hidden_layers is 2: a multi-layer MLA draft, which vLLM's deepseek_eagle3.py "
            "serves",
        ),
    ],
)
def test_what_vllm_would_not_serve_is_refused(
    mla_draft: Path, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    edit_config(mla_draft, **change)
    before = tree_digest(mla_draft)
    out = tmp_path / "o"
    result = CliRunner().invoke(main, ["export", str(mla_draft), str(out), "--calib", "none"])
    assert result.exit_code == 2 and result.output.startswith("error: "), result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert tree_digest(mla_draft) == before and not out.exists()


def test_moe_tensors_in_the_draft_layer_are_refused(mla_draft: Path) -> None:
    """vLLM's MLA draft model always builds a dense MLP: expert tensors would fail its loader."""
    path = mla_draft / "model.safetensors"
    tensors = load_file(str(path))
    tensors["midlayer.mlp.experts.0.gate_proj.weight"] = torch.zeros(8, 64, dtype=torch.bfloat16)
    save_file(tensors, str(path), metadata={"format": "pt"})
    code, report = inspect_json(mla_draft)
    assert code == 1
    assert report["problems"] == [
        f"{path}: tensor 'midlayer.mlp.experts.0.gate_proj.weight': is not part of this "
        "EAGLE-3 draft's form (vLLM would refuse to load it); remove it or check the "
        "checkpoint's origin"
    ]


def test_a_plain_deepseek_v2_config_over_eagle3_tensors_is_an_mla_draft(tmp_path: Path) -> None:
    """vLLM renames DeepseekV2ForCausalLM to Eagle3DeepseekV2ForCausalLM for method eagle3;
    without EAGLE-3 tensors (fc, the MLA midlayer) such a config is a target, not a draft."""
    config = draft_config(**MLA | {"architectures": ["DeepseekV2ForCausalLM"]})
    draft = write_random_draft(tmp_path / "plain", config, seed=5)
    code, report = inspect_json(draft)
    assert code == 0, report
    assert report["form"] == "plain MLA (DeepSeek-V2 attention) config, EAGLE-3 tensors"
    path = draft / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["fc.weight"]
    save_file(tensors, str(path), metadata={"format": "pt"})
    code, report = inspect_json(draft)
    assert code == 1 and report["form"] == "unrecognised"
    assert "is not an EAGLE-3 draft" in report["problems"][0]
