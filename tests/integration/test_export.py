"""Export with real Quark on a tiny in-code draft and target (marked slow: Quark import ~27 s)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from eaglequant.cli import main
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.recipe import load_recipe
from eaglequant.rules.draft import MIDLAYER_LINEARS, dims_from_config
from eaglequant.rules.exclusions import predict_fates
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.conftest import VOCAB, tree_digest
from tests.support import calib_args, run_capture, run_export

PASS_THROUGH = [
    "fc.weight",
    "lm_head.weight",
    "embed_tokens.weight",
    "norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "d2t",
    "t2d",
]


def _draft(pair: dict[str, Path], layers: int, tmp_path: Path) -> Path:
    """The pair's draft, or a random one of ``layers`` layers for the same target."""
    if layers == 1:
        return pair["draft"]
    config = draft_config(vocab=VOCAB, draft_vocab=256, num_hidden_layers=layers)
    return write_random_draft(tmp_path / f"draft-{layers}", config, seed=1)


def test_static_export_round_trip(pair: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "fp8"
    before = tree_digest(pair["draft"])
    run_export([str(pair["draft"]), str(out), *calib_args(pair)])
    assert tree_digest(pair["draft"]) == before
    src, written = read_checkpoint(pair["draft"]), read_checkpoint(out)
    for name in PASS_THROUGH:
        assert written.read_raw(name) == src.read_raw(name), name
    for name in MIDLAYER_LINEARS:
        assert written.tensors[f"{name}.weight"].dtype == "F8_E4M3"
        assert written.tensors[f"{name}.weight_scale"].dtype == "F32"
        assert written.tensors[f"{name}.input_scale"].shape == ()
    config = json.loads((out / "config.json").read_text())
    qcfg = config["quantization_config"]
    assert qcfg["exclude"] == ["re:.*fc.*", "re:.*lm_head.*"]
    assert qcfg["quant_method"] == "quark" and isinstance(qcfg["export"]["kv_cache_group"], list)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["torch_dtype"] == "bfloat16"
    fates = {f.vllm_name: f for f in predict_fates(config, 4)}
    assert not fates["model.fc"].quantized and not fates["lm_head"].quantized
    assert all(f.quantized for n, f in fates.items() if ".layers.4." in n)
    manifest = json.loads((out / "eaglequant.json").read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors"}
    assert manifest["calibration"]["calibrated"] and manifest["calibration"]["tokens"] == 6 * 64
    assert all(layer["sqnr_db"] > 20 for layer in manifest["layers"])
    assert len(manifest["top1_agreement_by_step"]) == 3
    assert manifest["device"]["type"] == "cpu"  # --device auto on a machine without accelerator
    assert manifest["calibration"]["capture"]["engine"]["name"] == "transformers"
    inspect = CliRunner().invoke(main, ["inspect", str(out), "--target-layers", "4"])
    assert inspect.exit_code == 0, inspect.output


@pytest.mark.parametrize("layers", [1, 2])
def test_capture_then_export_scales_equal_independent_float32_amax(
    pair: dict[str, Path], tmp_path: Path, layers: int
) -> None:
    """Every layer's static scales equal the module's own float32 ranges (a 2-layer draft's
    layers.1.* too), and the export measured every layer."""
    from eaglequant.capture.store import load_capture
    from eaglequant.model.load import load_draft_module
    from eaglequant.model.ranges import input_amax

    draft = _draft(pair, layers, tmp_path)
    capture = tmp_path / "capture"
    run_capture(pair, capture, "--draft", str(draft), "--samples", "8", "--seq-len", "48")
    assert json.loads((capture / "capture.json").read_text())["aux_layer_ids"] == [1, 2, 3]
    out = tmp_path / "fp8"
    run_export(
        [str(draft), str(out), "--calib-hidden-states", str(capture), "--calib-samples", "6"]
    )

    ckpt = read_checkpoint(draft)
    linears = dims_from_config(ckpt.config).linears
    manifest = json.loads((out / "eaglequant.json").read_text())
    assert [layer["name"] for layer in manifest["layers"]] == list(linears)
    assert all(layer["sqnr_db"] > 20 for layer in manifest["layers"])
    recipe = load_recipe()
    data = load_capture(capture, dims_from_config(ckpt.config))
    calib, _held = data.split(6, recipe.calibration.held_out)
    bf16 = load_draft_module(ckpt)
    amax = input_amax(bf16, calib.batches(recipe.calibration.batch_size), recipe.calibration.steps)
    assert set(amax) == set(linears)
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        for name in linears:
            input_scale = handle.get_tensor(f"{name}.input_scale")
            weight_scale = handle.get_tensor(f"{name}.weight_scale")
            expected_weight = bf16.get_submodule(name).weight.abs().max() / 448.0
            torch.testing.assert_close(
                input_scale, torch.tensor(amax[name] / 448.0), rtol=1e-6, atol=0
            )
            torch.testing.assert_close(weight_scale, expected_weight, rtol=1e-6, atol=0)
            dequant = handle.get_tensor(f"{name}.weight").float() * weight_scale
            weight = bf16.get_submodule(name).weight
            assert (dequant - weight).abs().max() <= weight.abs().max() / 16
    _check_six_sees_every_layer(pair, draft, out, capture, linears[-1], tmp_path)


def _check_six_sees_every_layer(
    pair: dict[str, Path], draft: Path, out: Path, capture: Path, last: str, tmp_path: Path
) -> None:
    """validate's check 6 on the export passes, and fails naming the last layer's linear
    when its input scale is 1000x too small."""
    import shutil

    from safetensors.torch import load_file, save_file

    from eaglequant.capture.run import CaptureEngine
    from eaglequant.recipe import ValidationSpec
    from eaglequant.validate.plausibility import PlausibilityInputs, plausibility_problems

    def problems(fp8: Path) -> list[str]:
        inputs = PlausibilityInputs(
            target=pair["target"],
            draft=read_checkpoint(fp8),
            baseline=read_checkpoint(draft),
            prompts=[],
            generated=None,
            k=3,
            tolerance=ValidationSpec.scale_tolerance,
            capture=CaptureEngine(name="transformers"),
            hidden_states=capture,
        )
        return plausibility_problems(inputs)[0]

    assert problems(out) == []
    bad = shutil.copytree(out, tmp_path / "bad")
    tensors = load_file(str(bad / "model.safetensors"))
    tensors[f"{last}.input_scale"] = tensors[f"{last}.input_scale"] / 1000
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    found = problems(bad)
    assert len(found) == 1 and found[0].startswith(f"{last}.input_scale = "), found
    assert ": clipping, 100.0% of the tokens have values beyond +-448 x scale" in found[0]


def test_calib_none_uses_recipe_range(pair: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "fp8"
    run_export([str(pair["draft"]), str(out), "--calib", "none", "--max-shard-size", "60KB"])
    written = read_checkpoint(out)
    assert written.sharded and len(written.shard_files) > 1
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(written.tensors)
    assert index["metadata"]["total_size"] == written.total_bytes
    for name in MIDLAYER_LINEARS:
        assert float(written.load_tensor(f"{name}.input_scale")) == pytest.approx(16.0 / 448.0)
    manifest = json.loads((out / "eaglequant.json").read_text())
    assert manifest["calibration"]["calibrated"] is False


def test_the_calibration_free_recipe_fixes_every_input_scale_at_one(
    pair: dict[str, Path], tmp_path: Path
) -> None:
    """``fp8-static-fixed``: ModelOpt's fixed amax 448, so input_scale 1.0, without --calib."""
    out = tmp_path / "fixed"
    run_export([str(pair["draft"]), str(out), "--recipe", "fp8-static-fixed"])
    written = read_checkpoint(out)
    for name in MIDLAYER_LINEARS:
        assert float(written.load_tensor(f"{name}.input_scale")) == 1.0
    manifest = json.loads((out / "eaglequant.json").read_text())
    assert manifest["recipe"]["name"] == "fp8-static-fixed"
    assert manifest["calibration"]["calibrated"] is False


@pytest.mark.parametrize("layers", [1, 2])
def test_ptpc_equals_quarks_own_file_to_file_flow(
    pair: dict[str, Path], tmp_path: Path, layers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quark.torch import ModelQuantizer

    import eaglequant.quantize
    from eaglequant.quantize.quark_backend import quark_config

    draft = _draft(pair, layers, tmp_path)
    out = tmp_path / "ptpc"
    # without calibration data no stage holds the draft as a module: importing one fails here
    monkeypatch.delattr(eaglequant.quantize, "module_flow", raising=False)
    monkeypatch.setitem(sys.modules, "eaglequant.quantize.module_flow", None)
    run_export([str(draft), str(out), "--recipe", "ptpc-fp8"])
    monkeypatch.undo()
    reference = tmp_path / "quark-f2f"
    ModelQuantizer(quark_config(load_recipe("ptpc-fp8"))).direct_quantize_checkpoint(
        str(draft), str(reference), device="cpu"
    )
    mine, theirs = read_checkpoint(out), read_checkpoint(reference)
    assert set(mine.tensors) == set(theirs.tensors)
    for name in mine.tensors:
        assert mine.read_raw(name) == theirs.read_raw(name), name
        assert mine.tensors[name].dtype == theirs.tensors[name].dtype, name
    for name in dims_from_config(mine.config).linears[6::7]:  # each layer's down_proj
        assert mine.tensors[f"{name}.weight"].dtype == "F8_E4M3"
    assert mine.tensors["midlayer.mlp.up_proj.weight_scale"].shape == (128,)
    assert "midlayer.mlp.up_proj.input_scale" not in mine.tensors
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["global_quant_config"]["input_tensors"]["is_dynamic"] is True
    assert qcfg["exclude"] == ["re:.*fc.*", "re:.*lm_head.*"]
    timings = json.loads((out / "eaglequant.json").read_text())["timings_s"]
    stages = [v for k, v in timings.items() if "." not in k and k not in ("startup", "total")]
    assert sum(stages) == pytest.approx(timings["total"] - timings["startup"], abs=0.1)
    assert timings["background.quark_import"] > 0 and timings["quantize.quark_file_to_file"] > 0
    # beside the write and verify stages: the measurement and the last fsync
    assert timings["background.measure"] > 0 and "background.final_fsync" in timings


def test_wrong_layout_prediction_is_replanned(
    pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If Quark writes other tensors than predicted, the output is re-planned, not wrong."""
    from eaglequant.quantize import artifact

    run_export([str(pair["draft"]), str(tmp_path / "planned"), "--recipe", "ptpc-fp8"])
    static = load_recipe("fp8-static")  # predicts per-tensor scales and input scales
    original = artifact.predicted_quantized
    monkeypatch.setattr(
        artifact, "predicted_quantized", lambda ckpt, _recipe: original(ckpt, static)
    )
    run_export([str(pair["draft"]), str(tmp_path / "replanned"), "--recipe", "ptpc-fp8"])
    planned, replanned = tree_digest(tmp_path / "planned"), tree_digest(tmp_path / "replanned")
    del planned["eaglequant.json"], replanned["eaglequant.json"]
    assert planned == replanned


def test_dry_run_writes_nothing(pair: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "never"
    result = CliRunner().invoke(
        main, ["export", str(pair["draft"]), str(out), *calib_args(pair), "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert "every check passed" in result.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_draft_without_embeddings_calibrates_with_captured_target_embeddings(
    pair: dict[str, Path], no_embed_draft: Path, tmp_path: Path
) -> None:
    draft = no_embed_draft
    capture = tmp_path / "capture"
    run_capture(pair, capture, "--samples", "6", "--seq-len", "32", "--embeddings")
    out = tmp_path / "fp8"
    run_export(
        [str(draft), str(out), "--calib-hidden-states", str(capture), "--calib-samples", "4"]
    )
    written = read_checkpoint(out)
    assert "embed_tokens.weight" not in written.tensors
    assert written.tensors["midlayer.mlp.down_proj.input_scale"].dtype == "F32"


def test_calib_none_exports_a_draft_without_embeddings(
    no_embed_draft: Path, tmp_path: Path
) -> None:
    """``--calib none`` calibrates nothing, so it needs no target embeddings either."""
    out = tmp_path / "fp8"
    run_export([str(no_embed_draft), str(out), "--calib", "none"])
    written = read_checkpoint(out)
    assert "embed_tokens.weight" not in written.tensors
    for name in MIDLAYER_LINEARS:
        assert float(written.load_tensor(f"{name}.input_scale")) == pytest.approx(16.0 / 448.0)
    manifest = json.loads((out / "eaglequant.json").read_text())
    assert manifest["calibration"]["calibrated"] is False
    assert manifest["top1_agreement_by_step"] == []
    assert manifest["calibration"]["held_out_tokens"] == 0
