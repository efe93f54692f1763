"""The engine configuration shared by validate and tune: parsing, checking, platform defaults."""

from __future__ import annotations

import pytest

from eaglequant.engine.config import (
    EngineOptions,
    VllmInstall,
    check_attention_backend,
    check_engine_args,
    cpu_thread_binding,
    llm_kwargs,
    parse_engine_arg,
    platform_defaults,
    platform_env,
    serve_line,
)
from eaglequant.errors import InputError
from eaglequant.rules.speculative import speculative_config

KNOWN = {"max_num_seqs", "gpu_memory_utilization", "enforce_eager", "kv_cache_dtype"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_num_seqs=8", ("max_num_seqs", 8)),
        ("gpu-memory-utilization=0.9", ("gpu_memory_utilization", 0.9)),
        ("enforce_eager=false", ("enforce_eager", False)),
        ("kv_cache_dtype=fp8", ("kv_cache_dtype", "fp8")),
        ('compilation_config={"level": 0}', ("compilation_config", {"level": 0})),
        ("distributed_executor_backend=ray", ("distributed_executor_backend", "ray")),
    ],
)
def test_engine_arg_values_are_json_where_they_parse(text: str, expected: tuple) -> None:
    assert parse_engine_arg(text) == expected


@pytest.mark.parametrize("text", ["max_num_seqs", "=8", ""])
def test_engine_arg_without_key_and_value_is_refused(text: str) -> None:
    with pytest.raises(InputError, match="write it as KEY=VALUE"):
        parse_engine_arg(text)


def test_unknown_and_reserved_keys_are_refused_with_a_hint() -> None:
    check_engine_args({"max_num_seqs": 8}, KNOWN)
    with pytest.raises(InputError, match="'max_num_seq' is not .*did you mean 'max_num_seqs'"):
        check_engine_args({"max_num_seq": 8}, KNOWN)
    with pytest.raises(InputError, match="'speculative_config' is set by eaglequant"):
        check_engine_args({"speculative_config": {}}, KNOWN | {"speculative_config"})


def test_cpu_defaults_apply_only_on_cpu_and_never_override_the_user() -> None:
    options = EngineOptions(tensor_parallel_size=4, engine_args={"enforce_eager": False})
    kwargs = llm_kwargs(options, "target", speculative_config("draft", 3))
    assert platform_defaults(kwargs, on_cpu=False) == kwargs
    assert "max_model_len" not in kwargs and kwargs["tensor_parallel_size"] == 4
    on_cpu = platform_defaults(kwargs, on_cpu=True)
    assert on_cpu["enforce_eager"] is False and on_cpu["max_model_len"] == 1024
    assert platform_env({}, on_cpu=False, workers=4, cores=[0, 1]) == {}
    # vLLM's AMX FP8 kernels (per-tensor; per-channel from 0.33) never quantize inputs
    w8a16 = "CPUFp8PerTensorScaledMMLinearKernel,CPUFp8ChannelWiseScaledMMLinearKernel"
    assert platform_env({}, on_cpu=True, workers=1, cores=[0, 1]) == {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_DISABLED_KERNELS": w8a16,
    }
    user = {"VLLM_CPU_KVCACHE_SPACE": "8", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    user |= {"VLLM_DISABLED_KERNELS": "SomeKernel"}
    added = platform_env(user, on_cpu=True, workers=2, cores=[0, 1])
    assert added == {"VLLM_DISABLED_KERNELS": f"SomeKernel,{w8a16}"}
    assert platform_env(user | added, on_cpu=True, workers=2, cores=[0, 1]) == {}


def test_cpu_thread_binding_gives_each_worker_its_own_cores() -> None:
    assert cpu_thread_binding([0, 1], 2) == "0|1"
    assert cpu_thread_binding([0, 1, 2, 3, 4], 2) == "0,1|2,3"
    with pytest.raises(InputError, match="2 CPU workers need at least 2 cores"):
        cpu_thread_binding([0], 2)


def test_serve_line_is_the_equivalent_vllm_serve_command() -> None:
    options = EngineOptions(
        tensor_parallel_size=4, engine_args={"gpu_memory_utilization": 0.9, "enforce_eager": False}
    )
    line = serve_line(llm_kwargs(options, "amd/Kimi-K2.5-MXFP4", speculative_config("d", 3)))
    assert line == (
        'vllm serve amd/Kimi-K2.5-MXFP4 --speculative-config \'{"model": "d", "method": '
        '"eagle3", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}\' '
        "--tensor-parallel-size 4 --gpu-memory-utilization 0.9 --no-enforce-eager"
    )


def test_a_draft_attention_backend_is_named_in_the_speculative_config_and_checked() -> None:
    """vLLM never lets a draft inherit the target's attention backend: it is asked in the
    speculative config, and a name vLLM does not have is refused before any engine starts."""
    spec = speculative_config("/d", 3, attention_backend="CPU_MLA")
    assert spec["attention_backend"] == "CPU_MLA"
    assert "attention_backend" not in speculative_config("/d", 3)
    install = VllmInstall("cpu", frozenset(), attention_backends=frozenset({"CPU_MLA", "AMX_MLA"}))
    check_attention_backend(None, install, "--draft-attention-backend")
    check_attention_backend("cpu_mla", install, "--draft-attention-backend")
    with pytest.raises(InputError, match=r"--draft-attention-backend 'FLASH_MLA': not one of .*"):
        check_attention_backend("FLASH_MLA", install, "--draft-attention-backend")
