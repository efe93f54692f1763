"""The speculators draft format: read as vLLM reads it, exported in the same format.

Drafts are made in code: the same tensors written in the EAGLE-3 layout and in the
speculators layout (``layers.0.*``, nested config), so every difference between
the two exports is the format's and nothing else.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.devtools.synthetic import draft_config, write_random_draft
from eaglequant.draft import MIDLAYER_LINEARS
from eaglequant.io import speculators
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.layout import blob_from_file
from eaglequant.io.writer import write_checkpoint_weights
from tests.conftest import TOY, as_speculators, edit_config, tree_digest


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output


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
    code, output = _invoke(["inspect", str(folder), "--json"])
    assert code == 0, output
    assert json.loads(output)["form"] == "speculators format, EAGLE-3 Qwen3"


def test_inspect_names_the_form_and_the_stored_tensor_names(tmp_path: Path) -> None:
    folder = write_random_draft(tmp_path / "s", draft_config(), speculators_verifier="t")
    edit_config(folder, norm_before_residual=True)
    code, output = _invoke(["inspect", str(folder), "--json"])
    assert code == 0, output
    report = json.loads(output)
    assert report["form"] == "speculators format, EAGLE-3 Llama (norm_before_residual)"
    assert report["architectures"] == ["Eagle3LlamaForCausalLM"]
    names = {n for fate in report["fates"] for n in fate["checkpoint_names"]}
    assert "layers.0.self_attn.q_proj" in names and not any("midlayer" in n for n in names)
    assert report["problems"] == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"speculators_model_type": "dflash"},
            "a speculators-format config vLLM would refuse: speculators_model_type is 'dflash', "
            "not 'eagle3'",
        ),
        (
            {"speculators_config": {"algorithm": "eagle3"}},
            "speculators_config lacks proposal_methods[0].speculative_tokens or "
            "verifier.name_or_path, which vLLM requires",
        ),
        ({"transformer_layer_config": None}, "'transformer_layer_config' is missing"),
    ],
)
def test_a_speculators_config_vllm_would_refuse_is_refused(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    folder = write_random_draft(tmp_path / "s", draft_config(), speculators_verifier="t")
    edit_config(folder, **change)
    before = tree_digest(folder)
    code, output = _invoke(["export", str(folder), str(tmp_path / "o"), "--calib", "none"])
    assert code == 2 and output.startswith(f"error: {folder / 'config.json'}: "), output
    assert message in output and len(output.strip().splitlines()) == 1, output
    assert tree_digest(folder) == before and not (tmp_path / "o").exists()


def test_a_folder_with_both_layouts_is_refused(tmp_path: Path) -> None:
    folder = write_random_draft(tmp_path / "s", draft_config(), speculators_verifier="t")
    ckpt = read_checkpoint(folder)
    up = ckpt.tensors["midlayer.mlp.up_proj.weight"]
    blobs = [blob_from_file(info) for info in ckpt.tensors.values()]
    both = tmp_path / "both"
    both.mkdir()
    write_checkpoint_weights(
        both, [*blobs, blob_from_file(up, "midlayer.mlp.up_proj.weight")], 10**12
    )
    (both / "config.json").write_text((folder / "config.json").read_text())
    code, output = _invoke(["inspect", str(both)])
    assert code == 2, output
    assert output == (
        f"error: {both}: holds both midlayer.* and layers.0.* tensors; this draft's format "
        "names its decoder layer layers.0 only\n"
    )


@pytest.mark.slow
def test_export_keeps_the_speculators_format_and_quantizes_identically(
    pair: dict[str, Path], tmp_path: Path
) -> None:
    """Same tensors in both layouts, same calibration: byte-identical FP8 tensors and scales;
    the speculators output keeps its config, with the quantization config where vLLM reads it."""
    spec = as_speculators(
        pair["draft"], tmp_path / "spec", "org/target", norm_before_residual=False
    )
    capture = tmp_path / "capture"
    args = ["--target", str(pair["target"]), "--data", str(pair["data"]), "--draft", str(spec)]
    args += ["--engine", "transformers", "--samples", "8", "--seq-len", "48"]
    code, output = _invoke(["capture", *args, str(capture)])
    assert code == 0, output
    before = tree_digest(spec)
    outs = {}
    for name, src in (("eagle3", pair["draft"]), ("spec", spec)):
        outs[name] = tmp_path / f"fp8-{name}"
        args = ["export", str(src), str(outs[name]), "--calib-hidden-states", str(capture)]
        code, output = _invoke([*args, "--calib-samples", "6"])
        assert code == 0, output
    assert tree_digest(spec) == before
    plain, written = read_checkpoint(outs["eagle3"]), read_checkpoint(outs["spec"])
    source = read_checkpoint(spec)
    assert written.speculators_format
    for name in plain.tensors:
        assert written.tensors[name].name == speculators.stored_name(name, "layers.0.")
        assert written.read_raw(name) == plain.read_raw(name), name
    for name in source.tensors:
        if name.removesuffix(".weight") not in MIDLAYER_LINEARS:
            assert written.read_raw(name) == source.read_raw(name), name
    stored_in = json.loads((spec / "config.json").read_text())
    stored_out = json.loads((outs["spec"] / "config.json").read_text())
    qcfg = stored_out.pop("quantization_config")  # top level: where vLLM reads it first
    assert stored_out == stored_in  # speculators_config and every other key intact
    assert qcfg["exclude"] == ["re:.*fc.*", "re:.*lm_head.*"]
    plain_qcfg = json.loads((outs["eagle3"] / "config.json").read_text())["quantization_config"]
    assert qcfg == plain_qcfg
    code, output = _invoke(["inspect", str(outs["spec"]), "--target-layers", "4"])
    assert code == 0 and "no problems found" in output, output
    # validate's checks before any engine, and the card, read the format as vLLM does
    from eaglequant.validate.validate import ValidateRequest, check_inputs

    request = ValidateRequest(
        target=pair["target"], draft=outs["spec"], baseline=spec, prompts=["x"], max_tokens=4
    )
    check_inputs(replace(request, hidden_states=capture))
    code, output = _invoke(["card", str(outs["spec"]), "--base-model", "org/target"])
    assert code == 0, output
    assert "re:.*fc.*" in (outs["spec"] / "README.md").read_text()


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


@pytest.mark.slow
def test_fix_config_rewrites_a_layer_config_quantization_config(tmp_path: Path) -> None:
    """A speculators draft whose quantization config sits in transformer_layer_config (vLLM
    reads it there too) with bare excludes: inspect shows vLLM quantizing fc, fix-config
    writes the regex form at the top level, where vLLM reads it first."""
    src = write_random_draft(tmp_path / "s", draft_config(), speculators_verifier="t")
    out = tmp_path / "fp8"
    code, output = _invoke(["export", str(src), str(out), "--calib", "none"])
    assert code == 0, output
    stored = json.loads((out / "config.json").read_text())
    qcfg = stored.pop("quantization_config")
    stored["transformer_layer_config"]["quantization_config"] = qcfg | {
        "exclude": ["fc", "lm_head"]
    }
    (out / "config.json").write_text(json.dumps(stored))
    code, output = _invoke(["inspect", str(out), "--json"])
    assert code == 1, output
    fates = {f["vllm_name"]: f["quantized"] for f in json.loads(output)["fates"]}
    assert fates["model.fc"]
    code, output = _invoke(["fix-config", str(out)])
    assert code == 0, output
    fixed = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in fixed["transformer_layer_config"]
    assert fixed["quantization_config"]["exclude"] == ["re:.*fc.*", "re:.*lm_head.*"]
    code, output = _invoke(["inspect", str(out)])
    assert code == 0 and "no problems found" in output, output


@pytest.mark.vllm
@pytest.mark.slow
def test_trained_speculators_draft_with_norm_before_residual_validates(tmp_path: Path) -> None:
    """The committed toy draft trained with norm_before_residual, in the speculators format:
    exported (format kept), then every validate check in real vLLM against its BF16 self."""
    from eaglequant.validate.validate import ValidateRequest, read_prompts, validate

    bf16 = TOY / "draft-speculators"
    assert read_checkpoint(bf16).config["norm_before_residual"]
    out = tmp_path / "fp8"
    args = ["export", str(bf16), str(out), "--calib-target", str(TOY / "target")]
    code, output = _invoke([*args, "--calib-data", str(TOY / "calibration.jsonl")])
    assert code == 0, output
    assert read_checkpoint(out).speculators_format
    request = ValidateRequest(
        target=TOY / "target",
        draft=out,
        baseline=bf16,
        prompts=read_prompts(TOY / "prompts.jsonl"),  # all 32 x 48: FP8/BF16 measured 0.986
        max_tokens=48,
        engine_timeout_s=300,
        lossless="strict",
    )
    report = validate(request)
    assert report.passed, [(c.name, c.detail) for c in report.checks]
    bf16_length = report.engines["bf16"]["acceptance"]["mean_length"]
    fp8_length = report.engines["fp8"]["acceptance"]["mean_length"]
    assert bf16_length > 1.5 and fp8_length >= 0.98 * bf16_length
