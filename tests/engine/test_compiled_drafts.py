"""Quantized toy drafts served as vLLM serves by default: torch.compile on, no enforce_eager.

eaglequant's own validation engines run eagerly on a CPU; a user's ``vllm serve`` compiles the
draft's forward. Every CPU path of the plugin that a draft's linears reach must run inside a
compiled graph: the static FP8 kernel (chosen at weight processing, called as one opaque op),
the per-token dynamic FP8 GEMM (``ptpc-fp8``, the form of AMD's published drafts) and OCP MXFP4.
Each runs in a child engine with vLLM's own kernels, and its drafts must be accepted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.engine.config import EngineOptions, llm_kwargs, platform_env
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.rules.speculative import speculative_config
from eaglequant.validate.validation import read_prompts
from tests.conftest import PYTHON, TOY, run_child

# The toy draft keeps nearly every token at k=3 when its linears compute what they should
# (static FP8 measures about 2.8); a path that computes garbage is accepted almost never.
MIN_ACCEPTANCE_LENGTH = 2.0
SCHEMES = {"fp8-static": "QuarkW8A8Fp8", "ptpc-fp8": "QuarkW8A8Fp8", "mxfp4": "QuarkOCP_MX"}


@pytest.fixture(scope="module")
def drafts(toy_fp8: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The toy draft in each recipe (the dynamic ones need no calibration)."""
    root = tmp_path_factory.mktemp("compiled-drafts")
    out = {"fp8-static": toy_fp8}
    for recipe in ("ptpc-fp8", "mxfp4"):
        out[recipe] = root / recipe
        args = ["export", str(TOY / "draft"), str(out[recipe]), "--recipe", recipe]
        result = CliRunner().invoke(main, [*args, "--calib", "none"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("recipe", list(SCHEMES))
def test_a_compiled_engine_serves_the_quantized_draft(
    recipe: str, drafts: dict[str, Path], tmp_path: Path
) -> None:
    llm = llm_kwargs(
        EngineOptions(), str(TOY / "target"), speculative_config(str(drafts[recipe]), 3)
    )
    spec = {
        "llm": {**llm, "enforce_eager": False},
        "prompts": read_prompts(TOY / "prompts.jsonl")[:4],
        "max_tokens": 24,
        "logprobs": None,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out.json"
    # vLLM's one-process executor; the CPU engines' environment (the AMX FP8 kernel off, so
    # that a static FP8 draft reaches the plugin's path on every x86 CPU kind)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env |= platform_env(env, True, 1, [])
    run_child(
        [PYTHON, "-m", "eaglequant.validate.engine_run", str(tmp_path / "spec.json"), str(out)],
        env=env,
    )
    result = json.loads(out.read_text())
    assert result["engine_config"]["llm"]["enforce_eager"] is False, result["engine_config"]
    assert result["plugin_active"], "the CPU FP8 plugin did not patch the stub FP8 ops"
    length = SpecDecodeCounts.from_vllm(result["metrics"]).mean_acceptance_length
    assert length is not None and length > MIN_ACCEPTANCE_LENGTH, result["metrics"]
    schemes = {layer["scheme"] for layer in result["draft_layers"] if ".layers." in layer["name"]}
    assert schemes == {SCHEMES[recipe]}, result["draft_layers"]
