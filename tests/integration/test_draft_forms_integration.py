"""The draft forms the tool recognises, the forward variants its module runs, and what it refuses.

Every form is made in code (tiny, random). What vLLM would not serve is refused with
its reason, never read with the wrong math.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.model.load import load_draft_module
from eaglequant.rules.draft import dims_from_config
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.conftest import MLA
from tests.support import invoke

FORMS = {
    "eagle3": {},
    "plain-llama": {"architectures": ["LlamaForCausalLM"]},
    "norm_before_residual": {"norm_before_residual": True},
    "norm_output": {"norm_output": True},
    "norm_before_fc": {"norm_before_fc": True},
    "fc_norm": {"fc_norm": True},
    "attention_bias": {"attention_bias": True},
    "qwen3": {"architectures": ["Eagle3Qwen3ForCausalLM"], "model_type": "qwen3"},
    "plain-qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
    "2-layers": {"num_hidden_layers": 2},
    "2-layers-plain-llama": {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2},
    "2-layers-qwen3": {"architectures": ["Eagle3Qwen3ForCausalLM"], "model_type": "qwen3"}
    | {"num_hidden_layers": 2, "attention_bias": True},
    "3-layers-speculators": {"num_hidden_layers": 3, "norm_before_residual": True},
    "mla": MLA,
    "plain-deepseek-v2": MLA | {"architectures": ["DeepseekV2ForCausalLM"]},
}


# An MLA draft's kv_b_proj stays BF16 (vLLM splits it into W_UK/W_UV, see eaglequant/forms/mla.py).
KV_B_PROJ = "re:(.*\\.)?layers\\.\\d+\\.self_attn\\.kv_b_proj$"


def test_plain_llama_config_over_eagle3_tensors_exports_and_keeps_its_form(
    tmp_path: Path,
) -> None:
    config = draft_config(architectures=["LlamaForCausalLM"])
    draft = write_random_draft(tmp_path / "plain", config, seed=4)
    code, output = invoke(["inspect", str(draft), "--json"])
    assert code == 0, output
    assert json.loads(output)["form"] == "plain Llama config, EAGLE-3 tensors"
    out = tmp_path / "fp8"
    code, output = invoke(["export", str(draft), str(out), "--calib", "none"])
    assert code == 0, output
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLM"]  # vLLM serves it as Eagle3Llama…
    assert written["quantization_config"]["exclude"] == ["re:.*fc.*", "re:.*lm_head.*"]
    assert read_checkpoint(out).tensors["midlayer.mlp.up_proj.weight"].dtype == "F8_E4M3"


def test_attention_bias_reaches_the_module_and_passes_through_export(tmp_path: Path) -> None:
    """q/k/v/o biases (vLLM's qkv_proj and o_proj carry them) are in the module's math, and
    the export keeps them byte for byte beside Quark's FP8 weights."""
    draft = write_random_draft(tmp_path / "d", draft_config(attention_bias=True), seed=6)
    model = load_draft_module(read_checkpoint(draft)).float()
    q_proj = model.midlayer.self_attn.q_proj
    assert q_proj.bias is not None and torch.equal(
        q_proj.bias, read_checkpoint(draft).load_tensor("midlayer.self_attn.q_proj.bias").float()
    )
    out = tmp_path / "fp8"
    code, output = invoke(["export", str(draft), str(out), "--calib", "none"])
    assert code == 0, output
    source, written = read_checkpoint(draft), read_checkpoint(out)
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        name = f"midlayer.self_attn.{proj}.bias"
        assert written.read_raw(name) == source.read_raw(name)
        assert written.tensors[f"midlayer.self_attn.{proj}.weight"].dtype == "F8_E4M3"


@pytest.mark.parametrize("form", sorted(FORMS))
def test_export_of_each_form_tensor_by_tensor(tmp_path: Path, form: str) -> None:
    """Every form exported: the same stored names, every layer's linears FP8 with per-tensor
    weight scales max|W|/448 (dequantized within one FP8 step), every other tensor (an MLA
    draft's kv_b_proj too) byte-identical, the config the input's plus the quantization
    config."""
    verifier = "target" if "speculators" in form else None
    config = draft_config(**FORMS[form])
    draft = write_random_draft(tmp_path / "d", config, seed=8, speculators_verifier=verifier)
    out = tmp_path / "fp8"
    code, output = invoke(["export", str(draft), str(out), "--calib", "none"])
    assert code == 0, output
    source, written = read_checkpoint(draft), read_checkpoint(out)
    linears = dims_from_config(source.config).linears
    assert len(linears) == 7 * config["num_hidden_layers"]  # an MLA layer's: all but kv_b_proj
    mla = "kv_lora_rank" in FORMS[form]
    assert ("midlayer.self_attn.kv_b_proj.weight" in source.tensors) == mla
    assert "midlayer.self_attn.kv_b_proj" not in linears
    quantized = {f"{name}.weight" for name in linears}
    for name, info in source.tensors.items():
        assert written.tensors[name].name == info.name
        if name not in quantized:
            assert written.read_raw(name) == source.read_raw(name), name
            continue
        layer = name.removesuffix(".weight")
        weight = source.load_tensor(name).float()
        scale = written.load_tensor(f"{layer}.weight_scale").float()
        torch.testing.assert_close(scale, weight.abs().max() / 448.0, rtol=1e-6, atol=0)
        dequantized = written.load_tensor(name).float() * scale
        assert written.tensors[name].dtype == "F8_E4M3"
        assert (dequantized - weight).abs().max() <= weight.abs().max() / 16
        assert written.tensors[f"{layer}.input_scale"].shape == ()
    assert set(written.tensors) == set(source.tensors) | {
        f"{n}{s}" for n in linears for s in (".weight_scale", ".input_scale")
    }
    config = json.loads((out / "config.json").read_text())
    kept = [KV_B_PROJ] if mla else []
    assert config.pop("quantization_config")["exclude"] == ["re:.*fc.*", "re:.*lm_head.*", *kept]
    assert config == json.loads((draft / "config.json").read_text())
