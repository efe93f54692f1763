"""The project's draft module computes what vLLM's own drafter computes, for each supported form.

vLLM (CPU, float32) runs speculative decoding with the toy target and a draft;
``tests/draft_recorder.py`` records the drafter's first two forwards (step 0 over
the prompt, step 1 on its own first token). The module, loaded from the same
folder in float32, is fed the same auxiliary states and tokens; its step-0 and
step-1 outputs (normed and the state the next step takes) must equal vLLM's to
float32 rounding: max |difference| <= 1e-4 of the largest magnitude (measured:
about 1e-6). Each variant is also run with its flag flipped in the module, and
that must fail the comparison by far: a flag the module ignored would show.
Multi-layer drafts (legacy Llama, speculators, Qwen3) likewise, each against
mutants that compute the layers after the first wrongly.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.model.eagle3 import Eagle3Draft, MidLayer
from eaglequant.model.load import load_draft_module
from eaglequant.rules.draft import dims_from_config, variant_shapes
from eaglequant_examples.synthetic import write_random_draft
from tests.conftest import (
    MLA_ENGINE,
    MLA_REFERENCE_BACKEND,
    MLA_YARN,
    PYTHON,
    REPO,
    TOY,
    as_qwen3,
    as_speculators,
    edit_config,
    run_child,
)

TOLERANCE = 1e-4
PROMPT = "def function_12(x):\n    return x * 12 + 5\n\ndef function_13(x):"


def _record(
    draft: Path, tmp_path: Path, target: Path = TOY / "target", attention_backend: str | None = None
) -> dict[str, torch.Tensor]:
    """The drafter's records (the target's and the draft's attention in ``attention_backend``,
    else as vLLM picks)."""
    spec = tmp_path / "spec.json"
    request = {"target": str(target), "draft": str(draft), "prompt": PROMPT, "k": 2}
    if attention_backend is not None:
        request["attention_backend"] = attention_backend
    spec.write_text(json.dumps(request))
    out = tmp_path / "records.safetensors"
    run_child([PYTHON, "-m", "tests.draft_recorder", str(spec), str(out)], cwd=REPO)
    return load_file(str(out))


def _add_variant_tensors(draft: Path) -> None:
    """The norms and biases the config's variants need, with values far from 1 and 0."""
    ckpt = read_checkpoint(draft)
    path = draft / "model.safetensors"
    tensors = load_file(str(path))
    for i, (name, shape) in enumerate(
        sorted(variant_shapes(dims_from_config(ckpt.config)).items())
    ):
        values = torch.linspace(0.25, 2.0, shape[0]) + 0.1 * i
        tensors[ckpt.stored_name(name)] = values.to(torch.bfloat16)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@torch.no_grad()
def _module_outputs(
    draft: Path,
    records: dict[str, torch.Tensor],
    mutate: Callable[[Eagle3Draft], None] | None = None,
    **flags: Any,
) -> list[float]:
    """Worst relative differences of the module's step 0 and 1 from vLLM's, per output
    (``flags`` edit the config the module is built from; ``mutate`` edits the module)."""
    ckpt = read_checkpoint(draft)
    ckpt.config.update(flags)
    model = load_draft_module(ckpt).float()
    if mutate is not None:
        mutate(model)
    aux = records["fc_input.0"]
    tokens = records["call0.input_ids"].long()
    length = len(tokens)
    steps = model.unroll(aux[None, :length], tokens[None], 2)
    first, second = steps
    assert records["call0.positions"].tolist() == list(range(length))
    same_token = int(records["call1.input_ids"][0]) == int(model.draft_to_target(first.top1)[0, -1])
    state = model.norm if model.dims.norm_output else (lambda prenorm: prenorm)
    diffs = [
        _relative(model.fc(model.fc_input(aux[:length])), records["call0.hidden_states"][:length]),
        _relative(state(first.prenorm[0]), records["call0.state"][:length]),
        _relative(model.norm(first.prenorm[0]), records["call0.last"][:length]),
        _relative(model.norm(second.prenorm[0, -1:]), records["call1.last"][:1]),
    ]
    diffs.append(_relative(state(second.prenorm[0, -1:]), records["call1.state"][:1]))
    return [*diffs, 0.0 if same_token else math.inf]  # step 1's token: the step-0 argmax


@pytest.mark.parametrize(
    ("form", "flags"),
    [
        ("eagle3-llama", {}),
        ("eagle3-llama", {"norm_before_residual": True}),
        ("eagle3-llama", {"norm_output": True}),
        ("eagle3-llama", {"norm_before_fc": True}),
        ("eagle3-llama", {"fc_norm": True}),
        ("eagle3-llama", {"attention_bias": True}),
        ("plain-llama", {}),
        # norm_before_residual absent from a speculators config: vLLM takes it as true
        ("speculators", {"norm_before_residual": True}),
        ("speculators", {"norm_output": True}),
        ("qwen3", {}),
        ("qwen3", {"norm_before_residual": True}),
    ],
)
def test_module_equals_vllms_drafter(tmp_path: Path, form: str, flags: dict[str, bool]) -> None:
    draft = tmp_path / "draft"
    if form == "plain-llama":
        config = json.loads((TOY / "draft" / "config.json").read_text())
        write_random_draft(draft, config | {"architectures": ["LlamaForCausalLM"]}, seed=5)
    elif form == "qwen3":
        as_qwen3(TOY / "draft", draft)
        edit_config(draft, **flags)
        _add_variant_tensors(draft)
    elif form == "speculators":
        as_speculators(TOY / "draft", draft, str(TOY / "target"))
        edit_config(draft, **flags | {"norm_before_residual": None})
    else:
        shutil.copytree(TOY / "draft", draft)
        edit_config(draft, **flags)
        _add_variant_tensors(draft)
    records = _record(draft, tmp_path)
    diffs = _module_outputs(draft, records)
    assert max(diffs) <= TOLERANCE, diffs
    as_read = read_checkpoint(draft).config
    assert all(as_read[flag] == value for flag, value in flags.items())  # vLLM's reading
    # variants with tensors flip only off: their tensors exist only when they are on
    flippable = ["norm_before_residual", "norm_output"]
    flippable += [f for f in flags if f in ("norm_before_fc", "fc_norm", "attention_bias")]
    changes: list[dict[str, Any]] = [{f: not as_read.get(f, False)} for f in flippable]
    if form == "qwen3":  # read as a Llama draft: the same tensors without q_norm / k_norm
        changes.append({"architectures": ["Eagle3LlamaForCausalLM"]})
    for change in changes:
        flipped = _module_outputs(draft, records, **change)
        assert max(flipped) > 100 * TOLERANCE, (change, flipped)


def _mla_draft(folder: Path, **changes: Any) -> Path:
    """A random MLA draft of the toy draft's shape; every norm weight far from 1 (a skipped
    norm shows)."""
    config = json.loads((TOY / "draft" / "config.json").read_text()) | MLA_ENGINE | changes
    write_random_draft(folder, config, seed=11)
    _distinct_norms(folder, step=0.1)  # the values the README's MLA numbers were measured with
    return folder


def _skip(module: str) -> Callable[[Eagle3Draft], None]:
    """A module edit that drops one MLA norm (replaced by the identity)."""

    def mutate(model: Eagle3Draft) -> None:
        setattr(model.midlayer.self_attn, module, torch.nn.Identity())

    return mutate


MLA_CASES = {
    # DeepSeek YaRN (cos/sin scaled by the mscale ratio 1.069, the softmax by
    # mscale_all_dim's 1.069**2), fc_norm
    "yarn": {"fc_norm": True, "norm_before_residual": False},
    # both residual/output variants
    "yarn-norms": {"norm_before_residual": True, "norm_output": True},
}
MLA_BREAKS: dict[str, list[dict[str, Any]]] = {
    "yarn": [
        {"rope_parameters": MLA_YARN | {"mscale_all_dim": 0.0}},  # the softmax mscale skipped
        {"rope_parameters": MLA_YARN | {"mscale": 0.5}},  # cos/sin mscale ratio 1 (skipped)
        {"rope_parameters": MLA_YARN | {"factor": 1.0}},  # no YaRN (plain RoPE frequencies)
        {"mutate": _skip("q_a_layernorm")},
        {"norm_before_residual": True},
    ],
    "yarn-norms": [{"norm_before_residual": False}, {"norm_output": False}],
}


@pytest.mark.parametrize("case", sorted(MLA_CASES))
def test_mla_module_equals_vllms_drafter(mla_target: Path, tmp_path: Path, case: str) -> None:
    """An MLA draft (Eagle3DeepseekV2ForCausalLM) behind a dense DeepSeek-V3 target, both MLA
    in vLLM-CPU's MLA backend (SDPA prefill for step 0, its decode kernel with kv_b_proj
    absorbed for step 1): the module's plain MLA math agrees to float32 rounding, and
    skipping the kv norm, the YaRN mscale or a variant fails by far."""
    draft = _mla_draft(tmp_path / "draft", **MLA_CASES[case])
    records = _record(draft, tmp_path, mla_target, MLA_REFERENCE_BACKEND)
    diffs = _module_outputs(draft, records)
    assert max(diffs) <= TOLERANCE, diffs
    for change in [{"mutate": _skip("kv_a_layernorm")}, *MLA_BREAKS[case]]:
        flipped = _module_outputs(draft, records, **change)
        assert max(flipped) > 100 * TOLERANCE, (change, flipped)


QWEN3 = {"architectures": ["Eagle3Qwen3ForCausalLM"], "model_type": "qwen3"}


@pytest.mark.parametrize(
    ("form", "in_speculators"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, False),
        (QWEN3, False),
        ({"num_hidden_layers": 2}, False),
        ({"num_hidden_layers": 2}, True),
        (QWEN3 | {"num_hidden_layers": 2}, False),
        (MLA_ENGINE, False),
    ],
    ids=["plain-llama", "qwen3", "2-layers", "2-layers-speculators", "2-layers-qwen3", "mla"],
)
def test_exported_draft_loads_as_inspect_predicts(
    tmp_path: Path, form: dict[str, Any], in_speculators: bool, request: pytest.FixtureRequest
) -> None:
    """A plain Llama config over EAGLE-3 tensors, a Qwen3 draft, 2-layer drafts (legacy,
    speculators, Qwen3) and an MLA draft (behind an MLA target), exported, served by a real
    engine: every layer built as inspect predicts (each draft layer's linears FP8 but an MLA
    draft's kv_b_proj, fc and lm_head BF16), validate's check 3."""
    from click.testing import CliRunner

    from eaglequant.cli import main
    from eaglequant.engine.config import EngineOptions
    from eaglequant.validate.layers import expected_schemes, layers_check
    from eaglequant.validate.request import ValidateRequest
    from eaglequant.validate.validation import run_engine

    config = json.loads((TOY / "draft" / "config.json").read_text())
    verifier = str(TOY / "target") if in_speculators else None
    draft = write_random_draft(tmp_path / "plain", config | form, speculators_verifier=verifier)
    out = tmp_path / "fp8"
    result = CliRunner().invoke(main, ["export", str(draft), str(out), "--calib", "none"])
    assert result.exit_code == 0, result.output
    inspect = CliRunner().invoke(main, ["inspect", str(out), "--json", "--target-layers", "4"])
    fates = {f["vllm_name"]: f["quantized"] for f in json.loads(inspect.output)["fates"]}
    mla = "kv_lora_rank" in form
    target = request.getfixturevalue("mla_target") if mla else TOY / "target"
    validating = ValidateRequest(
        target=target,
        draft=out,
        baseline=draft,
        prompts=[PROMPT],
        max_tokens=8,
        engine=EngineOptions(
            engine_args={"attention_backend": MLA_REFERENCE_BACKEND} if mla else {}
        ),
        draft_attention_backend=MLA_REFERENCE_BACKEND if mla else None,
    )
    engine = run_engine(validating, out)
    assert engine["ok"], engine["log"][-3000:]
    layers = engine["result"]["draft_layers"]
    expected = expected_schemes(read_checkpoint(out))
    check = layers_check(layers, expected)
    assert check.passed, check.detail
    kept = {name for name, scheme in expected.schemes.items() if scheme is None}
    assert kept == ({"self_attn.kv_b_proj"} if mla else set())
    # inspect names layers as vLLM's prefixes (model.layers.4 after a 4-layer target); the
    # engine's module tree counts the draft's own list (model.layers.0, model.layers.1, …).
    fates = {
        re.sub(r"\.layers\.(\d+)\.", lambda m: f".layers.{int(m[1]) - 4}.", n): q
        for n, q in fates.items()
    }
    built = {layer["name"]: layer["weight_dtype"] == "float8_e4m3fn" for layer in layers}
    common = [name for name in fates if name in built]
    in_layers = [name for name in common if ".layers." in name]
    per_layer = 6 if mla else 4  # MLA: fused_qkv_a_proj, q_b_proj, kv_b_proj, o_proj, MLP's two
    layer_count = form.get("num_hidden_layers", 1)
    assert len(in_layers) == per_layer * layer_count, (sorted(fates), sorted(built))
    assert len(common) >= len(in_layers) + 1, (sorted(fates), sorted(built))  # and model.fc
    assert not mla or len(common) == len(fates) == 8, (sorted(fates), sorted(built))
    assert {n: built[n] for n in common} == {n: fates[n] for n in common}
    assert built["model.fc"] is False and any(built.values())


LATER_FORWARD = MidLayer.later_forward


def _layer_skipped_residual(self: MidLayer, stream: torch.Tensor, *args: Any) -> torch.Tensor:
    """Mutant: the residual vLLM's fused add-norm carries into the layer is dropped."""
    stream = self.attend(self.input_layernorm(stream), *args)
    return stream + self.mlp(self.post_attention_layernorm(stream), *args[2:])


def _layer_forgets_keys(
    self: MidLayer, stream: torch.Tensor, positions: Any, _: Any, *rest: Any
) -> Any:
    """Mutant: the layer attends to its own step only, not its earlier steps' keys (KV cache)."""
    return LATER_FORWARD(self, stream, positions, ([], []), *rest)


def _distinct_norms(draft: Path, drop: tuple[str, ...] = (), step: float = 0.05) -> None:
    """Every norm weight far from 1 and different from every other (a swap would show): the
    i-th norm by name ``linspace(0.25, 2.0) + step * i``."""
    path = draft / "model.safetensors"
    tensors = {k: v for k, v in load_file(str(path)).items() if k not in drop}
    norms = [name for name in sorted(tensors) if "norm" in name]
    for i, name in enumerate(norms):
        tensors[name] = (torch.linspace(0.25, 2.0, tensors[name].numel()) + step * i).to(
            torch.bfloat16
        )
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize("form", ["eagle3-llama", "speculators", "qwen3"])
def test_multi_layer_module_equals_vllms_drafter(tmp_path: Path, form: str) -> None:
    """A 2-layer draft: the module equals vLLM's drafter; skipping layer 1, dropping the
    residual into it, or forgetting its earlier steps' keys misses by far."""
    draft = tmp_path / "draft"
    config = json.loads((TOY / "draft" / "config.json").read_text()) | {"num_hidden_layers": 2}
    verifier = str(TOY / "target") if form == "speculators" else None
    if form == "qwen3":
        config |= {"architectures": ["Eagle3Qwen3ForCausalLM"], "model_type": "qwen3"}
    write_random_draft(draft, config, seed=11, speculators_verifier=verifier)
    # speculators writes no hidden_norm after the first layer (vLLM builds one, unused)
    _distinct_norms(draft, ("layers.1.hidden_norm.weight",) if verifier else ())
    if verifier:
        edit_config(draft, norm_before_residual=None)  # absent: vLLM takes it as true
    records = _record(draft, tmp_path)
    diffs = _module_outputs(draft, records)
    assert max(diffs) <= TOLERANCE, diffs
    skipped = _module_outputs(draft, records, num_hidden_layers=1)
    assert max(skipped) > 100 * TOLERANCE, skipped
    for mutant in (_layer_skipped_residual, _layer_forgets_keys):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(MidLayer, "later_forward", mutant)
            wrong = _module_outputs(draft, records)
        assert max(wrong) > 100 * TOLERANCE, (mutant.__name__, wrong)
