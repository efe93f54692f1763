"""The fp8-static-kv recipe with real Quark on the tiny pair: calibrated K/V scales written
under the names vLLM's EAGLE-3 loader reads, the config vLLM parses into an FP8 KV cache,
check 6 on the K/V scales (and a corrupted one), and vLLM's own refusal on an AVX2 CPU."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglequant.rules.draft import MIDLAYER_LINEARS
from eaglequant.rules.inspection import inspect_checkpoint
from eaglequant.validate.plausibility import MAX_TOKENS_CLIPPED
from tests.conftest import PYTHON, REPO, run_child
from tests.support import calib_args, check6, run_export

KV_CONFIG = """
import json, sys
from vllm.model_executor.layers.quantization.quark.quark import QuarkConfig
qcfg = json.load(open(sys.argv[1] + "/config.json"))["quantization_config"]
print(json.dumps(QuarkConfig.from_config(qcfg).kv_cache_config))
"""
PROBE = "import sys; from eaglequant.engine.config import probe_vllm; " + (
    "print(repr(probe_vllm(sys.executable).fp8_kv_cache_refusal))"
)
K, V = "midlayer.self_attn.attn.k_scale", "midlayer.self_attn.attn.v_scale"


@pytest.fixture(scope="module")
def kv_export(pair: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kv") / "fp8-kv"
    run_export([str(pair["draft"]), str(out), "--recipe", "fp8-static-kv", *calib_args(pair)])
    return out


def test_kv_scales_are_written_where_vllm_reads_them(kv_export: Path) -> None:
    tensors = load_file(str(kv_export / "model.safetensors"))
    assert not [n for n in tensors if n.endswith(".output_scale")]  # Quark's names crash vLLM
    k, v = tensors[K], tensors[V]
    assert k.dtype == v.dtype == torch.float32 and k.shape == v.shape == ()
    assert float(k) == float(v) > 0  # Quark gives one layer's K and V their common scale
    for name in MIDLAYER_LINEARS:  # the rest is fp8-static's
        assert tensors[f"{name}.weight"].dtype == torch.float8_e4m3fn
        assert tensors[f"{name}.input_scale"].shape == ()
    qcfg = json.loads((kv_export / "config.json").read_text())["quantization_config"]
    assert qcfg["export"]["kv_cache_group"] == ["*k_proj", "*v_proj"]
    assert inspect_checkpoint(kv_export).problems == []
    kv_config = json.loads(run_child([PYTHON, "-c", KV_CONFIG, str(kv_export)]).splitlines()[-1])
    assert (kv_config["dtype"], kv_config["qscheme"]) == ("fp8_e4m3", "per_tensor")


def test_kv_scales_pass_check6_and_a_corrupted_one_fails(
    pair: dict[str, Path], kv_export: Path, tmp_path: Path
) -> None:
    """Check 6 judges each K/V scale by what it does to its projection's outputs: 100x too
    large only moves small values into E4M3's subnormals (FP8 is floating point) and passes;
    100x too small clips the V cache and fails, naming the scale and the cause."""
    found, numbers = check6(pair, kv_export)
    assert found == [], found
    kv = numbers["layers"]["midlayer.self_attn.v_proj"]["kv"]
    # calibrated on the calibration prompts, the V scale may clip a few of the validation
    # prompts' tokens (about 3% on this pair), within what check 6 allows
    assert kv["tokens_clipped"] <= MAX_TOKENS_CLIPPED and kv["sqnr_db"] > 25, kv
    for factor, passes in ((100, True), (0.01, False)):
        bad = shutil.copytree(kv_export, tmp_path / f"x{factor}")
        tensors = load_file(str(bad / "model.safetensors"))
        tensors[V] = tensors[V] * factor
        save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
        found, _ = check6(pair, bad)
        if passes:
            assert found == [], found
        else:
            assert len(found) == 1 and found[0].startswith(f"{V} = "), found
            assert ": clipping, " in found[0]


def test_vllm_refuses_an_fp8_kv_cache_on_an_avx2_cpu() -> None:
    """vLLM's own probe, asked as on an AVX2-only CPU (tests/as_avx2), gives its reason."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "tests" / "as_avx2"), ATEN_CPU_CAPABILITY="avx2")
    refusal = run_child([PYTHON, "-c", PROBE], env=env).splitlines()[-1]
    assert refusal == repr("FP8 KV cache on CPU requires x86 with AVX-512 or AMX.")
