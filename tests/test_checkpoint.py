"""Reading drafts: single and sharded files, index checks, header checks, shape checks."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eaglequant.draft import require_bf16_draft, structure_problems
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import INDEX_FILE, read_checkpoint
from eaglequant.io.safetensors_header import read_header
from tests.conftest import edit_config


def test_single_file_draft_reads_headers_lazily(tiny_draft: Path) -> None:
    ckpt = read_checkpoint(tiny_draft)
    assert not ckpt.sharded
    assert ckpt.tensors["fc.weight"].shape == (64, 192)
    assert ckpt.tensors["fc.weight"].dtype == "BF16"
    assert structure_problems(ckpt) == []
    loaded = ckpt.load_tensor("fc.weight")
    assert loaded.dtype == torch.bfloat16 and loaded.shape == (64, 192)


def test_sharded_draft_matches_single_file(tiny_draft: Path, sharded_draft: Path) -> None:
    single, sharded = read_checkpoint(tiny_draft), read_checkpoint(sharded_draft)
    assert sharded.sharded and len(sharded.shard_files) > 1
    assert set(single.tensors) == set(sharded.tensors)
    for name in single.tensors:
        assert single.read_raw(name) == sharded.read_raw(name)


def _index(folder: Path) -> dict:
    return json.loads((folder / INDEX_FILE).read_text())


def _write_index(folder: Path, index: dict) -> None:
    (folder / INDEX_FILE).write_text(json.dumps(index))


def test_index_naming_missing_shard(sharded_draft: Path) -> None:
    index = _index(sharded_draft)
    index["weight_map"]["fc.weight"] = "model-00099-of-00099.safetensors"
    _write_index(sharded_draft, index)
    with pytest.raises(InputError, match=r"names shard model-00099-of-00099.safetensors"):
        read_checkpoint(sharded_draft)


@pytest.mark.parametrize("bad", ["../outside.safetensors", "/etc/passwd", "sub/x.safetensors"])
def test_index_shard_path_must_stay_inside(sharded_draft: Path, bad: str) -> None:
    index = _index(sharded_draft)
    index["weight_map"]["fc.weight"] = bad
    _write_index(sharded_draft, index)
    with pytest.raises(InputError, match="not a plain file name inside the model folder"):
        read_checkpoint(sharded_draft)


def test_index_shard_symlink_leading_outside(sharded_draft: Path, tmp_path: Path) -> None:
    index = _index(sharded_draft)
    shard = index["weight_map"]["fc.weight"]
    outside = tmp_path / "elsewhere.safetensors"
    (sharded_draft / shard).rename(outside)
    os.symlink(outside, sharded_draft / shard)
    with pytest.raises(InputError, match="link leading outside the model folder"):
        read_checkpoint(sharded_draft)


def test_index_maps_tensor_to_shard_lacking_it(sharded_draft: Path) -> None:
    index = _index(sharded_draft)
    index["weight_map"]["ghost.weight"] = index["weight_map"]["fc.weight"]
    _write_index(sharded_draft, index)
    with pytest.raises(InputError, match=r"tensor 'ghost.weight' is mapped to .*which lacks it"):
        read_checkpoint(sharded_draft)


def test_tensor_in_two_shards(sharded_draft: Path) -> None:
    index = _index(sharded_draft)
    shards = sorted(set(index["weight_map"].values()))
    extra = sharded_draft / "model-extra.safetensors"
    save_file({"norm.weight": torch.ones(64, dtype=torch.bfloat16)}, str(extra))
    index["weight_map"]["norm.weight"] = extra.name
    _write_index(sharded_draft, index)
    assert shards
    with pytest.raises(InputError, match="tensor 'norm.weight' is stored in both"):
        read_checkpoint(sharded_draft)


def test_shard_not_in_index(sharded_draft: Path) -> None:
    save_file({"x": torch.zeros(2)}, str(sharded_draft / "stray.safetensors"))
    with pytest.raises(InputError, match="stray.safetensors holds weights but is not in the index"):
        read_checkpoint(sharded_draft)


def test_pickle_weights_refused(tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(InputError, match="pickle-based weights are refused"):
        read_checkpoint(folder)


def _raw_file(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_header_length_beyond_file(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 10_000) + b"{}")
    with pytest.raises(InputError, match="header length 10000 exceeds the file size"):
        read_header(path)


def test_header_not_json(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="header is not valid JSON"):
        read_header(_raw_file(tmp_path / "x.safetensors", b"{nope"))


def test_offsets_out_of_range(tmp_path: Path) -> None:
    header = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    with pytest.raises(InputError, match="run past the end of the data"):
        read_header(_raw_file(tmp_path / "x.safetensors", header, b"\0" * 8))


def test_overlapping_tensors(tmp_path: Path) -> None:
    header = json.dumps(
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        }
    ).encode()
    with pytest.raises(InputError, match="overlap"):
        read_header(_raw_file(tmp_path / "x.safetensors", header, b"\0" * 12))


def test_truncated_file(tiny_draft: Path) -> None:
    path = tiny_draft / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated"):
        read_checkpoint(tiny_draft)


def test_not_an_eagle_draft(tiny_draft: Path) -> None:
    edit_config(tiny_draft, architectures=["LlamaForCausalLM"])
    with pytest.raises(InputError, match="is not an EAGLE-3 Llama draft"):
        require_bf16_draft(read_checkpoint(tiny_draft))


def test_two_layers_refused(tiny_draft: Path) -> None:
    edit_config(tiny_draft, num_hidden_layers=2)
    with pytest.raises(InputError, match="num_hidden_layers is 2"):
        require_bf16_draft(read_checkpoint(tiny_draft))


def test_fc_width_must_match_target_hidden(tiny_draft: Path) -> None:
    edit_config(tiny_draft, target_hidden_size=80)
    with pytest.raises(
        InputError,
        match=r"tensor 'fc.weight'.*has shape \[64, 192\], the config implies \[64, 240\]",
    ):
        require_bf16_draft(read_checkpoint(tiny_draft))


def test_every_mismatch_is_named(tiny_draft: Path) -> None:
    edit_config(tiny_draft, intermediate_size=96, draft_vocab_size=100)
    problems = [str(p) for p in structure_problems(read_checkpoint(tiny_draft))]
    named = {p.split("tensor '")[1].split("'")[0] for p in problems if "tensor '" in p}
    assert {"midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight"} <= named
    assert {"midlayer.mlp.down_proj.weight", "lm_head.weight", "d2t"} <= named


def test_missing_midlayer_tensor(tmp_path: Path, tiny_draft: Path) -> None:
    ckpt = read_checkpoint(tiny_draft)
    tensors = {
        n: ckpt.load_tensor(n) for n in ckpt.tensors if n != "midlayer.self_attn.k_proj.weight"
    }
    save_file(tensors, str(tiny_draft / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match="tensor 'midlayer.self_attn.k_proj.weight' is missing"):
        require_bf16_draft(read_checkpoint(tiny_draft))


def test_already_quantized_draft_points_to_inspect(tiny_draft: Path) -> None:
    ckpt = read_checkpoint(tiny_draft)
    tensors = {n: ckpt.load_tensor(n) for n in ckpt.tensors}
    tensors["midlayer.mlp.up_proj.weight"] = tensors["midlayer.mlp.up_proj.weight"].to(
        torch.float8_e4m3fn
    )
    save_file(tensors, str(tiny_draft / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match="already quantized.*eaglequant inspect"):
        require_bf16_draft(read_checkpoint(tiny_draft))
