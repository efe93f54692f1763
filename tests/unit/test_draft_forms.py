"""The draft forms the tool recognises, the forward variants its module runs, and what it refuses.

Every form is made in code (tiny, random). What vLLM would not serve is refused with
its reason, never read with the wrong math.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.model.load import load_draft_module, load_reference_layer
from eaglequant.rules.draft import FIRST_LAYER, structure_problems
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.conftest import edit_config, tree_digest
from tests.support import invoke


def _rename_tensors(folder: Path, old: str, new: str) -> None:
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = {k.replace(old, new, 1): v for k, v in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def _step_outputs(draft: Path, **flags: bool) -> list[torch.Tensor]:
    edit_config(draft, **{k: v or None for k, v in flags.items()})
    model = load_draft_module(read_checkpoint(draft)).float()
    generator = torch.Generator().manual_seed(0)
    aux = torch.randn(1, 6, model.dims.fc_in, generator=generator)
    ids = torch.randint(0, model.dims.vocab, (1, 6), generator=generator)
    return [s.logits for s in model.unroll(aux, ids, 2) if s.logits is not None]


LAYERED = {
    "eagle3": ({}, None, "midlayer."),
    "speculators": ({}, "target", "layers.0."),
    "qwen3": (
        {"architectures": ["Eagle3Qwen3ForCausalLM"], "model_type": "qwen3"},
        None,
        "layers.0.",
    ),
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"architectures": ["Eagle3DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"},
            "vLLM 0.32 serves an MLA EAGLE-3 draft only as 'deepseek_v2'",
        ),
        ({"architectures": ["MistralForCausalLM"]}, "is not an EAGLE-3 draft"),
    ],
)
def test_forms_vllm_would_not_serve_are_refused_with_its_reason(
    tiny_draft: Path, tmp_path: Path, change: dict, message: str
) -> None:
    edit_config(tiny_draft, **change)
    before = tree_digest(tiny_draft)
    code, output = invoke(["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none"])
    assert code == 2 and output.startswith("error: ") and message in output, output
    assert len(output.strip().splitlines()) == 1
    assert tree_digest(tiny_draft) == before and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("flag", "tensor"), [("norm_before_fc", "input_norm.weight"), ("fc_norm", "fc_norm.0.weight")]
)
def test_a_variant_without_its_norm_tensor_is_refused(
    tiny_draft: Path, tmp_path: Path, flag: str, tensor: str
) -> None:
    edit_config(tiny_draft, **{flag: True})
    code, output = invoke(["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none"])
    assert code == 2, output
    assert output == f"error: {tiny_draft}: tensor '{tensor}' is missing; re-export the draft\n"


def test_qwen3_drafts_are_read_with_layers_0_names_and_q_k_norms(tmp_path: Path) -> None:
    config = draft_config(architectures=["Qwen3ForCausalLM"], model_type="qwen3")
    draft = write_random_draft(tmp_path / "q", config, seed=7)
    ckpt = read_checkpoint(draft)
    assert ckpt.layer_prefix == "layers.0." and not ckpt.speculators_format
    assert (
        ckpt.tensors["midlayer.self_attn.q_norm.weight"].name == "layers.0.self_attn.q_norm.weight"
    )
    code, output = invoke(["inspect", str(draft), "--json"])
    assert code == 0, output
    assert json.loads(output)["form"] == "plain Qwen3 config, EAGLE-3 tensors"
    model = load_draft_module(ckpt)
    assert model.midlayer.self_attn.q_norm is not None


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda folder: edit_config(folder, head_dim=None),
            "a Qwen3 draft without 'head_dim': vLLM takes Qwen3Config's default (128), not "
            "hidden_size / num_attention_heads; add head_dim to the config",
        ),
        (
            lambda folder: edit_config(folder, use_sliding_window=True),
            "a Qwen3 draft with use_sliding_window: vLLM runs the layers its layer_types (or "
            "max_window_layers) name with a sliding window, which eaglequant's module does not",
        ),
        (
            lambda folder: _rename_tensors(folder, "layers.0.", "midlayer."),
            "tensor 'midlayer.hidden_norm.weight': vLLM loads this draft's decoder layer as "
            "layers.0.*, not midlayer.*; rename the midlayer.* tensors to layers.0.*",
        ),
    ],
)
def test_qwen3_drafts_vllm_would_misread_are_refused(
    tmp_path: Path, edit: Any, message: str
) -> None:
    config = draft_config(architectures=["Eagle3Qwen3ForCausalLM"], model_type="qwen3")
    draft = write_random_draft(tmp_path / "q", config, seed=7)
    edit(draft)
    code, output = invoke(["export", str(draft), str(tmp_path / "o"), "--calib", "none"])
    assert code == 2 and output.startswith("error: ") and message in output, output


def test_a_plain_llama_config_without_eagle3_tensors_is_not_a_draft(tmp_path: Path) -> None:
    config = draft_config(architectures=["LlamaForCausalLM"])
    draft = write_random_draft(tmp_path / "plain", config, seed=4)
    (draft / "model.safetensors").rename(draft / "other.bin")
    code, output = invoke(["inspect", str(draft)])
    assert code == 2, output


@pytest.mark.parametrize("flag", ["norm_before_residual", "norm_output"])
def test_each_variant_flag_changes_the_math(tiny_draft: Path, flag: str) -> None:
    """Each flag reaches the module's forward (ignoring it would leave these equal)."""
    plain = _step_outputs(tiny_draft)
    varied = _step_outputs(tiny_draft, **{flag: True})
    # norm_output only changes the steps after the first; norm_before_residual every step.
    first_differs = flag == "norm_before_residual"
    assert (not torch.allclose(plain[0], varied[0])) == first_differs
    assert not torch.allclose(plain[1], varied[1])


def test_norm_before_residual_is_vllms_formula(tiny_draft: Path) -> None:
    """Step 0 with norm_before_residual, written out from vLLM's layer: the normed hidden
    state is both the attention input's second half and the residual."""
    edit_config(tiny_draft, norm_before_residual=True)
    model = load_draft_module(read_checkpoint(tiny_draft)).float()
    layer = model.midlayer
    generator = torch.Generator().manual_seed(1)
    aux = torch.randn(1, 5, model.dims.fc_in, generator=generator)
    ids = torch.randint(0, model.dims.vocab, (1, 5), generator=generator)
    got = model.unroll(aux, ids, 1)[0].prenorm
    hidden = model.fc(aux)
    normed = layer.hidden_norm(hidden)
    x = torch.cat([layer.input_layernorm(model.embed_tokens(ids).float()), normed], -1)
    positions = torch.arange(5).expand(1, 5)
    q, k, v = layer.self_attn.project(x, positions)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    residual = normed + layer.self_attn.attend(q, k, v, causal)
    expected = residual + layer.mlp(layer.post_attention_layernorm(residual))
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("form", sorted(LAYERED))
def test_inspect_names_every_layer_of_a_multi_layer_draft(tmp_path: Path, form: str) -> None:
    """vLLM builds draft layer i as model.layers.<target layers + i> from the first layer's
    stored names (midlayer.* or layers.0.*), then layers.i.*; inspect says so per linear."""
    change, verifier, first = LAYERED[form]
    config = draft_config(num_hidden_layers=2, **change)
    draft = write_random_draft(tmp_path / "d", config, seed=3, speculators_verifier=verifier)
    code, output = invoke(["inspect", str(draft), "--json", "--target-layers", "4"])
    assert code == 0, output
    report = json.loads(output)
    assert ", 2 layers" in report["form"] and report["dims"]["layers"] == 2
    fates = {f["vllm_name"]: f["checkpoint_names"] for f in report["fates"]}
    for index, stored in ((4, first), (5, "layers.1.")):
        layer = f"model.layers.{index}"
        assert fates[f"{layer}.self_attn.qkv_proj"] == [
            f"{stored}self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")
        ]
        assert fates[f"{layer}.mlp.gate_up_proj"] == [
            f"{stored}mlp.gate_proj",
            f"{stored}mlp.up_proj",
        ]
        assert fates[f"{layer}.self_attn.o_proj"] == [f"{stored}self_attn.o_proj"]
        assert fates[f"{layer}.mlp.down_proj"] == [f"{stored}mlp.down_proj"]
    assert len(fates) == 10 and "model.layers.6.mlp.down_proj" not in fates


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.__setitem__(
                "layers.2.mlp.down_proj.weight", t["layers.1.mlp.down_proj.weight"].clone()
            ),
            "tensor 'layers.2.mlp.down_proj.weight': is not part of this EAGLE-3 draft's form "
            "(vLLM would refuse to load it)",
        ),
        (
            lambda t: t.__setitem__("layers.1.self_attn.k_proj.weight", torch.zeros(32, 128)),
            "tensor 'layers.1.self_attn.k_proj.weight': has shape [32, 128], the config implies "
            "[32, 64]",
        ),
        (
            lambda t: t.pop("layers.1.post_attention_layernorm.weight"),
            "tensor 'layers.1.post_attention_layernorm.weight' is missing, which num_hidden_layers "
            "2 requires",
        ),
    ],
)
def test_multi_layer_drafts_vllm_would_misread_are_refused(
    tmp_path: Path, edit: Any, message: str
) -> None:
    """A layer beyond num_hidden_layers, a later layer taking 2*hidden inputs (only the first
    does), a later layer's missing norm."""
    from safetensors.torch import load_file, save_file

    draft = write_random_draft(tmp_path / "d", draft_config(num_hidden_layers=2), seed=3)
    path = draft / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})
    code, output = invoke(["export", str(draft), str(tmp_path / "o"), "--calib", "none"])
    assert code == 2 and output.startswith("error: ") and message in output, output
    assert len(output.strip().splitlines()) == 1


def test_a_later_layer_is_vllms_formula(tmp_path: Path) -> None:
    """Step 0 of a 2-layer draft, written out from vLLM's llama_eagle3.py: layer 0 returns
    (mlp output, residual); layer 1's input_layernorm and post_attention_layernorm are fused
    add-norms on that residual; the final norm adds the last residual."""
    config = draft_config(num_hidden_layers=2, norm_before_residual=True)
    draft = write_random_draft(tmp_path / "d", config, seed=9)
    model = load_draft_module(read_checkpoint(draft)).float()
    first, later = model.midlayer, model.layers["1"]
    assert later.hidden_norm is None and later.self_attn.q_proj.in_features == 64
    with torch.no_grad():  # distinct norms, so that swapping two would show
        for i, norm in enumerate((later.input_layernorm, later.post_attention_layernorm)):
            norm.weight.copy_(torch.linspace(0.5, 1.5, 64) + i)
    generator = torch.Generator().manual_seed(1)
    aux = torch.randn(1, 5, model.dims.fc_in, generator=generator)
    ids = torch.randint(0, model.dims.vocab, (1, 5), generator=generator)
    got = model.unroll(aux, ids, 1)[0].prenorm
    positions = torch.arange(5).expand(1, 5)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()

    def attention(layer: Any, x: torch.Tensor) -> torch.Tensor:
        return layer.self_attn.attend(*layer.self_attn.project(x, positions), causal)

    residual = first.hidden_norm(model.fc(aux))
    x = torch.cat([first.input_layernorm(model.embed_tokens(ids).float()), residual], -1)
    residual = residual + attention(first, x)
    hidden = first.mlp(first.post_attention_layernorm(residual))
    residual = hidden + residual  # layer 1's input_layernorm(hidden, residual)
    hidden = attention(later, later.input_layernorm(residual))
    residual = hidden + residual  # post_attention_layernorm(hidden, residual)
    hidden = later.mlp(later.post_attention_layernorm(residual))
    torch.testing.assert_close(got, hidden + residual)  # model.norm(hidden, residual)'s sum


@pytest.mark.parametrize("flag", ["norm_before_fc", "fc_norm"])
def test_fc_input_norms_are_vllms_formula(tmp_path: Path, flag: str) -> None:
    """norm_before_fc: one RMSNorm over fc's whole input; fc_norm: one per auxiliary state
    (vLLM's combine_hidden_states); step 0's fused state is fc of the normed input."""
    draft = write_random_draft(tmp_path / "d", draft_config(**{flag: True}), seed=2)
    model = load_draft_module(read_checkpoint(draft)).float()
    generator = torch.Generator().manual_seed(3)
    aux = torch.randn(2, 4, model.dims.fc_in, generator=generator) * 5
    norms = [model.input_norm] if flag == "norm_before_fc" else list(model.fc_norm or [])
    with torch.no_grad():
        for i, norm in enumerate(norms):
            assert norm is not None
            norm.weight.copy_(torch.linspace(0.5, 1.5, norm.weight.numel()) + i)
    chunks = aux.chunk(len(norms), -1)
    expected = torch.cat(
        [
            c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + 1e-5) * n.weight
            for c, n in zip(chunks, norms, strict=True)
        ],
        -1,
    )
    torch.testing.assert_close(model.fc_input(aux), expected)
    ids = torch.randint(0, model.dims.vocab, (2, 4), generator=generator)
    with_norm = model.unroll(aux, ids, 1)[0].prenorm
    setattr(model, "input_norm" if flag == "norm_before_fc" else "fc_norm", None)
    assert not torch.allclose(with_norm, model.unroll(aux, ids, 1)[0].prenorm)


def test_fc_scales_on_a_bf16_fc_are_a_problem(tiny_draft: Path, tmp_path: Path) -> None:
    """fc may be quantized (ModelOpt quantizes it): its scales are the form's, and whether vLLM
    builds fc as stored is the quantization config's question, which inspect answers."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tiny_draft / "model.safetensors"))
    tensors["fc.input_scale"] = torch.tensor(0.01)
    tensors["fc.weight_scale"] = torch.tensor(0.001)
    save_file(tensors, str(tiny_draft / "model.safetensors"), metadata={"format": "pt"})
    assert structure_problems(read_checkpoint(tiny_draft)) == []
    code, output = invoke(["inspect", str(tiny_draft), "--json"])
    assert code == 1
    assert json.loads(output)["problems"] == [
        f"{tiny_draft / 'config.json'}: no quantization_config but tensor 'fc.input_scale' is "
        "quantized; re-export with eaglequant export"
    ]
    assert "would refuse" not in output


def test_the_measurement_layers_carry_the_biases(tmp_path: Path) -> None:
    """The held-out measurement's reference layer (as stored) and its simulated FP8 copy add
    the q/k/v/o biases too: without them both would describe a network vLLM does not run."""
    from eaglequant.quantize.measure import simulated_fp8_draft
    from eaglequant.recipe import FP8_E4M3_MAX, load_recipe

    draft = write_random_draft(tmp_path / "d", draft_config(attention_bias=True), seed=6)
    ckpt = read_checkpoint(draft)
    model = load_draft_module(ckpt).float()
    reference = load_reference_layer(ckpt, FIRST_LAYER)
    x = torch.randn(2, 3, 2 * model.dims.hidden, generator=torch.manual_seed(0))
    projections = ("q_proj", "k_proj", "v_proj")
    for proj in projections:
        exact = model.midlayer.self_attn.get_submodule(proj)
        torch.testing.assert_close(reference.self_attn.get_submodule(proj)(x), exact(x))
    tensors = {}
    for name in model.dims.linears:
        weight = model.get_submodule(name).weight
        scale = weight.abs().amax() / FP8_E4M3_MAX
        tensors[f"{name}.weight"] = (weight / scale).to(torch.float8_e4m3fn)
        tensors[f"{name}.weight_scale"] = scale
    fp8 = simulated_fp8_draft(model, tensors, load_recipe("ptpc-fp8"))
    without = simulated_fp8_draft(model, tensors, load_recipe("ptpc-fp8"))
    for proj in projections:
        without.midlayer.self_attn.get_submodule(proj).bias = None
        bias = model.midlayer.self_attn.get_submodule(proj).bias
        added = fp8.midlayer.self_attn.get_submodule(proj)(x)
        torch.testing.assert_close(
            added - without.midlayer.self_attn.get_submodule(proj)(x), bias.expand_as(added)
        )
