"""The speculators draft format: read as vLLM reads it, exported in the same format.

Drafts are made in code: the same tensors written in the EAGLE-3 layout and in the
speculators layout (``layers.0.*``, nested config), so every difference between
the two exports is the format's and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from eaglequant.io import speculators
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.rules.draft import MIDLAYER_LINEARS
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.conftest import as_speculators, tree_digest
from tests.support import invoke


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
    code, output = invoke(["capture", *args, str(capture)])
    assert code == 0, output
    before = tree_digest(spec)
    outs = {}
    for name, src in (("eagle3", pair["draft"]), ("spec", spec)):
        outs[name] = tmp_path / f"fp8-{name}"
        args = ["export", str(src), str(outs[name]), "--calib-hidden-states", str(capture)]
        code, output = invoke([*args, "--calib-samples", "6"])
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
    code, output = invoke(["inspect", str(outs["spec"]), "--target-layers", "4"])
    assert code == 0 and "no problems found" in output, output
    # validate's checks before any engine, and the card, read the format as vLLM does
    from eaglequant.validate.request import ValidateRequest, check_inputs

    request = ValidateRequest(
        target=pair["target"], draft=outs["spec"], baseline=spec, prompts=["x"], max_tokens=4
    )
    check_inputs(replace(request, hidden_states=capture))
    code, output = invoke(["card", str(outs["spec"]), "--base-model", "org/target"])
    assert code == 0, output
    assert "re:.*fc.*" in (outs["spec"] / "README.md").read_text()


def test_fix_config_rewrites_a_layer_config_quantization_config(tmp_path: Path) -> None:
    """A speculators draft whose quantization config sits in transformer_layer_config (vLLM
    reads it there too) with bare excludes: inspect shows vLLM quantizing fc, fix-config
    writes the regex form at the top level, where vLLM reads it first."""
    src = write_random_draft(tmp_path / "s", draft_config(), speculators_verifier="t")
    out = tmp_path / "fp8"
    code, output = invoke(["export", str(src), str(out), "--calib", "none"])
    assert code == 0, output
    stored = json.loads((out / "config.json").read_text())
    qcfg = stored.pop("quantization_config")
    stored["transformer_layer_config"]["quantization_config"] = qcfg | {
        "exclude": ["fc", "lm_head"]
    }
    (out / "config.json").write_text(json.dumps(stored))
    code, output = invoke(["inspect", str(out), "--json"])
    assert code == 1, output
    fates = {f["vllm_name"]: f["quantized"] for f in json.loads(output)["fates"]}
    assert fates["model.fc"]
    code, output = invoke(["fix-config", str(out)])
    assert code == 0, output
    fixed = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in fixed["transformer_layer_config"]
    assert fixed["quantization_config"]["exclude"] == ["re:.*fc.*", "re:.*lm_head.*"]
    code, output = invoke(["inspect", str(out)])
    assert code == 0 and "no problems found" in output, output
