"""Reading drafts and checking their shapes (bad files through the CLI: test_cli_errors.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.safetensors_header import read_header
from eaglequant.rules.draft import require_bf16_draft, structure_problems
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


def _raw_file(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_overlapping_tensors(tmp_path: Path) -> None:
    header = json.dumps(
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        }
    ).encode()
    with pytest.raises(InputError, match="overlap"):
        read_header(_raw_file(tmp_path / "x.safetensors", header, b"\0" * 12))


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_file_check_counts_nan_and_inf_as_torch_does(tmp_path: Path, dtype: torch.dtype) -> None:
    from eaglequant.model.finite import check_finite

    values = torch.randn(1000, dtype=torch.float64).to(dtype) * 1e3
    values[[3, 500, 999]] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
    values[7] = torch.finfo(dtype).max  # all exponent bits but one: finite
    save_file(
        {"w": values, "ok": values.nan_to_num(0.0, 0.0, 0.0)}, str(tmp_path / "m.safetensors")
    )
    tensors = read_header(tmp_path / "m.safetensors").tensors
    check_finite(tensors["ok"])
    expected = int((~torch.isfinite(values)).sum())
    with pytest.raises(InputError, match=f"tensor 'w' holds {expected} NaN/Inf"):
        check_finite(tensors["w"])
