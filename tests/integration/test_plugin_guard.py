"""The CPU plugin's patches are guarded one by one: a moved vLLM internal switches off only
the patch that needs it, logged in one line naming it (vLLM in a child), and eaglequant's
engines refuse, in one line, to run without it."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from eaglequant.engine import cpu_fp8_plugin as plugin
from tests.conftest import PYTHON, TOY, run_child

BROKEN_TARGET = textwrap.dedent(
    """
    import json, logging, os
    from vllm.model_executor.kernels import linear
    del linear._POSSIBLE_MXFP8_KERNELS  # a vLLM that moved the table
    from eaglequant.engine import cpu_fp8_plugin as plugin
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger(plugin.LOGGER).addHandler(handler)
    from vllm import LLM, SamplingParams
    # a plain vLLM run: the engine in this process loads the plugin as every vLLM process does
    llm = LLM(TOY_TARGET, max_model_len=256, enforce_eager=True, seed=0)
    out = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=4))
    print(json.dumps({
        "tokens": list(out[0].outputs[0].token_ids),
        "applied": plugin.applied_patches(),
        "failed": plugin.failed_patches(),
        "stubs": plugin.fp8_ops_are_stubs(),
        "active": os.environ.get(plugin.ACTIVE_ENV) == "1",
        "lines": lines,
    }))
    """
)


def test_a_broken_patch_target_is_logged_by_name_and_vllm_still_serves() -> None:
    # In a child: the plugin loads vLLM's kernel library, which the test process may not.
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLEQUANT_CPU_")}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in the script's process
    script = BROKEN_TARGET.replace("TOY_TARGET", repr(str(TOY / "target")))
    out = run_child([PYTHON, "-c", script], env=env)
    result = json.loads(out.strip().splitlines()[-1])
    assert len(result["tokens"]) == 4  # vLLM served the BF16 model
    assert result["failed"] == ["list_mxfp8_on_cpu"]
    assert len(result["lines"]) == 1, result["lines"]
    assert result["lines"][0].startswith(
        "eaglequant CPU plugin: list_mxfp8_on_cpu not applied (AttributeError: "
    )
    applied = set(result["applied"])
    assert {"list_mxfp4_emulation_on_cpu", "use_torch_mxfp4_on_cpu"} <= applied
    assert "per_tensor_inputs_in_channelwise_mm" in applied
    # the FP8 ops are patched exactly where this vLLM build has stubs
    assert ("torch_fp8_quant_ops" in applied) == result["stubs"] == result["active"]


def test_eaglequant_engines_refuse_in_one_line_where_a_patch_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from eaglequant.validate.engine_run import require_cpu_patches

    monkeypatch.setenv(plugin.FAILED_ENV, "list_mxfp8_on_cpu")
    monkeypatch.setattr("vllm.plugins.load_general_plugins", lambda: None)
    with pytest.raises(SystemExit) as refused:
        require_cpu_patches()
    assert str(refused.value).startswith(
        "eaglequant CPU plugin: list_mxfp8_on_cpu not applied in this vLLM (see the log line "
    )
    monkeypatch.setenv(plugin.FAILED_ENV, "")
    require_cpu_patches()
