"""The speculators draft format: read as vLLM reads it, exported in the same format.

Drafts are made in code: the same tensors written in the EAGLE-3 layout and in the
speculators layout (``layers.0.*``, nested config), so every difference between
the two exports is the format's and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eaglequant.io import speculators
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.layout import blob_from_file
from eaglequant.io.writer import write_checkpoint_weights
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.conftest import edit_config, tree_digest
from tests.support import invoke


def test_inspect_names_the_form_and_the_stored_tensor_names(tmp_path: Path) -> None:
    folder = write_random_draft(tmp_path / "s", draft_config(), speculators_verifier="t")
    edit_config(folder, norm_before_residual=True)
    code, output = invoke(["inspect", str(folder), "--json"])
    assert code == 0, output
    report = json.loads(output)
    assert report["form"] == "speculators format, EAGLE-3 Llama (norm_before_residual)"
    assert report["architectures"] == ["Eagle3LlamaForCausalLM"]
    names = {n for fate in report["fates"] for n in fate["checkpoint_names"]}
    assert "layers.0.self_attn.q_proj" in names and not any("midlayer" in n for n in names)
    assert report["problems"] == []


def test_from_flat_config_moves_the_set_eagle3_keys_to_the_top() -> None:
    flat = draft_config(target_hidden=96, aux_layer_ids=None, quantization_config={"a": 1})
    flat["draft_vocab_size"] = None  # unset: stays with the layer config, as vLLM reads it
    stored = speculators.from_flat_config(flat, verifier="t")
    assert list(stored) == [
        "architectures",
        "speculators_model_type",
        "target_hidden_size",
        *speculators.EAGLE3_FIELDS,
        "transformer_layer_config",
        "speculators_config",
    ]
    assert [stored[k] for k in speculators.EAGLE3_FIELDS] == [False] * 4
    layer = stored["transformer_layer_config"]
    moved = ("target_hidden_size", "architectures", "quantization_config")
    assert list(layer) == [k for k in flat if k not in moved] + ["architectures"]
    assert layer["draft_vocab_size"] is None and layer["architectures"] == ["LlamaForCausalLM"]


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
    code, output = invoke(["export", str(folder), str(tmp_path / "o"), "--calib", "none"])
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
    code, output = invoke(["inspect", str(both)])
    assert code == 2, output
    assert output == (
        f"error: {both}: holds both midlayer.* and layers.0.* tensors; this draft's format "
        "names its decoder layer layers.0 only\n"
    )
