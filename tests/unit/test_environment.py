"""The environment block: stable facts only, read from /proc/cpuinfo and package metadata."""

from __future__ import annotations

from eaglequant.results.environment import (
    cpu_info,
    environment,
    environment_markdown,
    reproducing_env,
)

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512vl avx512_bf16 avx512_vnni
processor\t: 1
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512vl avx512_bf16 avx512_vnni
"""
AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx avx2 fma\n"


def test_cpu_info_reads_model_count_and_the_isa_flags_that_matter() -> None:
    info = cpu_info(ZEN4)
    assert info["model"] == "AMD EPYC 9R14"
    assert info["logical_cpus"] == 2
    assert info["family"] == "25"
    assert info["isa_flags"] == [
        "avx2",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_bf16",
        "avx512_vnni",
    ]
    assert cpu_info(AVX2_ONLY)["isa_flags"] == ["avx2"]


def test_per_run_random_variables_are_left_out() -> None:
    environ = {
        "VLLM_DIST_IDENT": "vllm_dist_3f9a",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_SHM_BUFFER": "psm_1234",
        "HOME": "/root",
    }
    assert reproducing_env(environ) == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_block_names_the_stack_and_renders_without_paths() -> None:
    block = environment(environ={"VLLM_CPU_KVCACHE_SPACE": "1"}, gpus=False)
    assert {"eaglequant", "vllm", "torch", "transformers", "amd-quark"} <= set(block["versions"])
    text = environment_markdown(block)
    assert "eaglequant " in text and "CPU: " in text and "GPUs: none" in text
    assert "`VLLM_CPU_KVCACHE_SPACE=1`" in text
    assert "/root" not in text
