"""vLLM's three x86 CPU kernel builds, each forced in a child and run with the toy FP8 draft.

vLLM's CPU platform loads exactly one of ``_C_AVX2`` (AVX2 only), ``_C_AVX512``
(AVX-512 without BF16) or ``_C`` (AVX-512 with BF16), chosen by torch's ISA
probe in ``CpuPlatform.import_kernels()``; loading a second one aborts the
process. Each case below makes the probe report a CPU kind before vLLM loads
its kernels, registers the project's FP8 plugin (vLLM's general plugins) and
runs one real engine: the target with the static FP8 toy draft. So an AVX-512
machine proves the AVX2 path too. A path is skipped only where this CPU cannot
execute it, and the skip says so.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from eaglequant.engine.config import EngineOptions, llm_kwargs
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.rules.speculative import speculative_config
from eaglequant.validate.validation import read_prompts
from tests.conftest import PYTHON, TOY, run_child

# path -> (AVX-512 reported, AVX-512 BF16 reported, the library vLLM must load)
PATHS = {
    "avx2": (False, False, "_C_AVX2.abi3.so"),
    "avx512": (True, False, "_C_AVX512.abi3.so"),
    "avx512-bf16": (True, True, "_C.abi3.so"),
}
FORCE_ISA = textwrap.dedent(
    """
    import runpy, sys, torch
    avx512, bf16 = {avx512}, {bf16}
    real_amx = torch.cpu._is_amx_tile_supported()
    torch.cpu._is_avx512_supported = lambda: avx512
    torch.cpu._is_avx512_bf16_supported = lambda: bf16
    torch.cpu._is_amx_tile_supported = lambda: real_amx and bf16
    sys.argv = ["engine_run", {spec!r}, {out!r}]
    runpy.run_module("eaglequant.validate.engine_run", run_name="__main__")
    """
)


def _unsupported(avx512: bool, bf16: bool) -> str | None:
    if avx512 and not torch.cpu._is_avx512_supported():
        return "this CPU has no AVX-512, so vLLM's AVX-512 kernels cannot run here"
    if bf16 and not torch.cpu._is_avx512_bf16_supported():
        return "this CPU has no AVX-512 BF16, so vLLM's _C kernels would be SIGILL here"
    return None


@pytest.mark.parametrize("path", list(PATHS))
def test_engine_runs_the_fp8_draft_on_each_cpu_kernel_build(
    path: str, toy_fp8: Path, tmp_path: Path
) -> None:
    avx512, bf16, library = PATHS[path]
    reason = _unsupported(avx512, bf16)
    if reason:
        pytest.skip(f"{path}: {reason}")
    spec = {
        "llm": llm_kwargs(
            EngineOptions(), str(TOY / "target"), speculative_config(str(toy_fp8), 3)
        ),
        "prompts": read_prompts(TOY / "prompts.jsonl")[:4],
        "max_tokens": 24,
        "logprobs": None,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out.json"
    code = FORCE_ISA.format(
        avx512=avx512, bf16=bf16, spec=str(tmp_path / "spec.json"), out=str(out)
    )
    run_child([PYTHON, "-c", code], env=_engine_env())
    result = json.loads(out.read_text())
    vllm_c = [name for name in result["kernels"] if name.startswith("_C")]
    assert vllm_c == [library], result["kernels"]
    assert result["plugin_active"], "the CPU FP8 plugin did not patch the stub FP8 ops"
    length = SpecDecodeCounts.from_vllm(result["metrics"]).mean_acceptance_length
    assert length is not None and length > 2.0, result["metrics"]
    schemes = {layer["scheme"] for layer in result["draft_layers"] if ".layers." in layer["name"]}
    assert schemes == {"QuarkW8A8Fp8"}, result["draft_layers"]


def test_plugin_detects_the_stub_ops_of_the_library_vllm_loaded() -> None:
    code = (
        "from vllm.platforms import current_platform as p\n"
        "from eaglequant.engine.cpu_fp8_plugin import fp8_ops_are_stubs\n"
        "print(p.device_type, fp8_ops_are_stubs())\n"
    )
    lines = run_child([PYTHON, "-c", code], env=_engine_env()).strip().splitlines()
    device, stubs = lines[-1].split()
    if device != "cpu":
        pytest.skip(f"stub detection is only meaningful on the CPU build (platform {device})")
    assert stubs == "True"


def _engine_env() -> dict[str, str]:
    import os

    return dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
