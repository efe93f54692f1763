"""Calibrated FP8 KV-cache scales: the recipe, the names vLLM's EAGLE-3 loader reads, the KV
cache dtype a scaled draft runs with, check 3 against the scales vLLM holds, and the refusal
where vLLM cannot run an FP8 KV cache (no Quark, no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eaglequant.cli import main
from eaglequant.engine.config import VllmInstall, check_kv_cache_dtype
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.recipe import load_recipe, recipe_from_dict
from eaglequant.results.engine_result import DraftAttention
from eaglequant.rules.draft import kv_scale_name, structure_problems
from eaglequant.rules.speculative import draft_kv_cache_dtype
from eaglequant.validate.layers import checkpoint_kv_scales, kv_cache_problems

REFUSAL = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."


def test_the_kv_recipe_is_fp8_static_with_kv_scales() -> None:
    recipe, plain = load_recipe("fp8-static-kv"), load_recipe("fp8-static")
    assert recipe.kv_cache.scaled and not plain.kv_cache.scaled
    assert recipe.scheme() == plain.scheme() + " / KV fp8_e4m3 static"
    assert (recipe.weight, recipe.activation) == (plain.weight, plain.activation)


def test_kv_scales_need_a_calibrated_recipe() -> None:
    data = {"name": "x", "activation": {"dynamic": True}, "kv_cache": {"dtype": "fp8_e4m3"}}
    with pytest.raises(InputError) as err:
        recipe_from_dict(data, "origin")
    assert str(err.value) == (
        "origin: 'kv_cache.dtype: fp8_e4m3' calibrates K and V scales with the input scales; "
        "it needs static inputs ('activation.dynamic: false')"
    )


def test_kv_scales_are_named_as_vllms_eagle3_loader_reads_them() -> None:
    assert kv_scale_name("midlayer.self_attn.k_proj") == "midlayer.self_attn.attn.k_scale"
    assert kv_scale_name("layers.1.self_attn.v_proj") == "layers.1.self_attn.attn.v_scale"
    assert kv_scale_name("midlayer.self_attn.q_proj") is None


def _with_tensors(draft: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path = draft / "model.safetensors"
    save_file(load_file(str(path)) | tensors, str(path), metadata={"format": "pt"})
    return draft


def test_the_form_takes_attn_kv_scales_and_refuses_quarks_names(tiny_draft: Path) -> None:
    scales = {
        "midlayer.self_attn.attn.k_scale": torch.tensor(0.25),
        "midlayer.self_attn.attn.v_scale": torch.tensor(0.5),
    }
    _with_tensors(tiny_draft, scales)
    assert structure_problems(read_checkpoint(tiny_draft)) == []
    assert checkpoint_kv_scales(read_checkpoint(tiny_draft)) == [(0.25, 0.5)]
    _with_tensors(tiny_draft, {"midlayer.self_attn.k_proj.output_scale": torch.tensor(0.25)})
    problems = [str(p) for p in structure_problems(read_checkpoint(tiny_draft))]
    assert len(problems) == 1 and "'midlayer.self_attn.k_proj.output_scale'" in problems[0]


def test_a_scaled_draft_runs_with_an_fp8_kv_cache_unless_asked_otherwise() -> None:
    scaled = {"quantization_config": {"export": {"kv_cache_group": ["*k_proj", "*v_proj"]}}}
    plain = {"quantization_config": {"export": {"kv_cache_group": []}}}
    assert draft_kv_cache_dtype(None, scaled) == "fp8_e4m3"
    assert draft_kv_cache_dtype("auto", scaled) == "auto"
    assert draft_kv_cache_dtype(None, plain) is None
    assert draft_kv_cache_dtype("fp8", {}) == "fp8"


def test_an_fp8_kv_cache_is_refused_with_vllms_reason_where_it_cannot_run() -> None:
    avx2 = VllmInstall("cpu", frozenset(), fp8_kv_cache_refusal=REFUSAL)
    check_kv_cache_dtype("bfloat16", avx2, "--draft-kv-cache-dtype")
    check_kv_cache_dtype(None, avx2, "--draft-kv-cache-dtype")
    check_kv_cache_dtype("fp8", VllmInstall("cpu", frozenset()), "--draft-kv-cache-dtype")
    with pytest.raises(InputError) as err:
        check_kv_cache_dtype("fp8_e4m3", avx2, "recipe fp8-static-kv (kv_cache.dtype)")
    assert str(err.value) == (
        "recipe fp8-static-kv (kv_cache.dtype): a fp8_e4m3 draft KV cache, which vLLM cannot "
        f'run on this machine ("{REFUSAL}", its CPU attention backend); run it where vLLM can '
        "(a GPU, or a CPU with AVX-512 or AMX), or pass --draft-kv-cache-dtype auto to keep "
        "the target's KV cache dtype"
    )


def _attention(dtype: str, k: float, v: float) -> DraftAttention:
    return {"name": "model.layers.2.self_attn.attn", "kv_cache_dtype": dtype, "k_scale": k,
            "v_scale": v}  # fmt: skip


def test_check3_holds_vllms_kv_scales_to_the_checkpoints() -> None:
    assert kv_cache_problems([_attention("fp8_e4m3", 0.25, 0.5)], [(0.25, 0.5)]) == (
        [],
        "; FP8 draft KV cache with the checkpoint's K/V scales (1)",
    )
    problems, _ = kv_cache_problems([_attention("fp8_e4m3", 1.0, 1.0)], [(0.25, 0.5)])
    assert problems == [
        "model.layers.2.self_attn.attn holds K/V scales 1/1, the checkpoint 0.25/0.5"
    ]
    assert kv_cache_problems([_attention("auto", 1.0, 1.0)], [(0.25, 0.5)]) == (
        [],
        " (the checkpoint's K/V scales unused: draft KV cache auto)",
    )
    assert kv_cache_problems([_attention("fp8", 1.0, 1.0)], []) == (
        [],
        " (draft KV cache FP8 with K/V scales 1.0: none calibrated)",
    )
    assert kv_cache_problems([_attention("auto", 1.0, 1.0)], []) == ([], "")


def test_compare_refuses_a_kv_recipe_where_vllm_cannot_run_it(
    tiny_draft: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eaglequant.validate import compare

    monkeypatch.setattr(
        compare, "probe_vllm", lambda _python: VllmInstall("cpu", frozenset(), "", 0, REFUSAL)
    )
    (tmp_path / "target").mkdir()
    (tmp_path / "p.txt").write_text("x\n")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    args = [str(tiny_draft), "--target", str(tmp_path / "target"), "--out", str(tmp_path / "o")]
    args += ["--prompts", str(tmp_path / "p.txt"), "--calib-data", str(tmp_path / "c.jsonl")]
    result = CliRunner().invoke(main, ["compare", *args, "--recipes", "fp8-static,fp8-static-kv"])
    assert result.exit_code == 2
    assert result.output.startswith(
        "error: recipe fp8-static-kv (kv_cache.dtype): a fp8_e4m3 draft KV cache, which vLLM "
    )
    assert not (tmp_path / "o").exists()
