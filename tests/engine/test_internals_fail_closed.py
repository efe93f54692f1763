"""vLLM internals that moved fail closed: a named error or a refused swap, never a PASS.

Each case runs a real engine child on the toy pair with one attribute eaglequant reads
taken off the live vLLM objects (``tests.internals_mutants``), as a vLLM that renamed it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from eaglequant.engine.config import EngineOptions
from eaglequant.engine.process import run_child as engine_child
from eaglequant.validate.request import ValidateRequest, engine_prompts
from eaglequant.validate.single_engine import shared_spec
from eaglequant.validate.validation import read_prompts
from tests.conftest import TOY


def _request(fp8: Path) -> ValidateRequest:
    return ValidateRequest(
        target=TOY / "target",
        draft=fp8,
        baseline=TOY / "draft",
        prompts=read_prompts(TOY / "prompts.jsonl")[:2],
        max_tokens=8,
        engine_timeout_s=300,
        engine=EngineOptions(),
    )


def _run(mutant: str, module: str, spec: dict) -> tuple[bool, str, dict | None]:
    with tempfile.TemporaryDirectory(prefix="eaglequant-mutant-") as scratch:
        spec_path, out = Path(scratch) / "spec.json", Path(scratch) / "out.json"
        log = Path(scratch) / "child.log"
        spec_path.write_text(json.dumps(spec))
        env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        argv = [sys.executable, "-m", "tests.internals_mutants", mutant, module]
        ended = engine_child([*argv, str(spec_path), str(out)], log, env, 300)
        result = json.loads(out.read_text()) if ended.ok and out.is_file() else None
        return ended.ok, log.read_text(errors="replace"), result


@pytest.mark.parametrize(
    ("mutant", "named"),
    [
        ("no-kv-scale", "layers.attention.attention._k_scale_float (read in vLLM 0.32.0"),
        ("no-draft-model", "SpecDecodeBaseProposer.model (read in vLLM 0.32.0"),
    ],
)
def test_a_missing_draft_internal_is_a_named_error(mutant: str, named: str, toy_fp8: Path) -> None:
    request = _request(toy_fp8)
    spec = shared_spec(request, engine_prompts(request), [toy_fp8]).to_json()
    one = {k: spec[k] for k in ("llm", "prompts", "add_special_tokens", "max_tokens")}
    ok, log, result = _run(mutant, "engine_run", one | {"logprobs": None})
    assert not ok and result is None  # no result that a check could read as a pass
    assert "this vLLM has no" in log and named in log, log[-2000:]


def test_a_swap_without_its_internal_is_refused_by_name(toy_fp8: Path) -> None:
    request = _request(toy_fp8)
    spec = shared_spec(request, engine_prompts(request), [TOY / "draft", toy_fp8]).to_json()
    ok, log, result = _run("no-attn-names", "single_engine", spec)
    assert ok and result is not None, log[-2000:]
    assert len(result["runs"]) == 1  # the first draft ran; the swap to the second was refused
    assert "SpecDecodeBaseProposer._draft_attn_layer_names (read in vLLM" in result["refused"]
