"""One engine, many drafts: a draft swapped into a running engine gives a fresh engine's run.

On the CPU toy pair, one engine serves BF16 -> static FP8 -> PTPC FP8 -> BF16
with other weights -> BF16; each run must equal a fresh engine with that draft
in its token ids, its accepted-token counts per position and the layers vLLM
built (read through the worker extension). Two faulty swaps must fail the same
comparison: the prefix cache kept (``tests.swap_mutants no-reset``: the next draft is
served prompt blocks whose draft KV the previous draft wrote, which the engine's
prefix-cache counters show) and the old draft's model kept (``old-weights``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eaglequant.cli import main
from eaglequant.engine.child_request import ControlTokens
from eaglequant.engine.config import EngineOptions
from eaglequant.results.engine_result import EngineRun
from eaglequant.validate.request import ValidateRequest, engine_prompts
from eaglequant.validate.single_engine import run_shared, run_single, shared_spec
from eaglequant.validate.validation import read_prompts, run_engine
from tests.conftest import PYTHON, REPO, TOY, run_child

BLOCK_SIZE = 32
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def other_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy draft's shape with other weights: what it writes into the KV cache differs."""
    out = tmp_path_factory.mktemp("other") / "other"
    out.mkdir()
    shutil.copy(TOY / "draft" / "config.json", out / "config.json")
    weights = load_file(str(TOY / "draft" / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    for name, tensor in weights.items():
        if name.startswith("midlayer.") and tensor.dim() == 2:
            noise = torch.randn(tensor.shape, generator=generator) * tensor.float().std()
            weights[name] = (tensor.float() + noise).to(tensor.dtype)
    save_file(weights, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def ptpc_fp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ptpc") / "ptpc"
    args = ["export", str(TOY / "draft"), str(out), "--recipe", "ptpc-fp8"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


def _request(fp8: Path) -> ValidateRequest:
    texts = read_prompts(TOY / "prompts.jsonl")
    prompts = ["".join(texts[i : i + 4]) for i in (0, 4, 8)]  # several KV blocks each
    return ValidateRequest(
        target=TOY / "target",
        draft=fp8,
        baseline=TOY / "draft",
        prompts=prompts,
        max_tokens=MAX_TOKENS,
        engine_timeout_s=300,
        engine=EngineOptions(engine_args={"block_size": BLOCK_SIZE}),
    )


def _seen(result: dict[str, Any]) -> dict[str, Any]:
    """What must match a fresh engine: tokens, spec-decode counters (all and per prompt),
    the drafter as built."""
    return {k: result[k] for k in ("token_ids", "metrics", "per_request", "draft_layers")}


@pytest.fixture(scope="module")
def fresh(toy_fp8: Path, ptpc_fp8: Path) -> dict[Path, dict[str, Any]]:
    request = _request(toy_fp8)
    runs = {}
    for draft in (TOY / "draft", toy_fp8, ptpc_fp8):
        engine = run_engine(request, draft)
        assert engine["ok"], engine["log"][-3000:]
        runs[draft] = _seen(engine["result"])
    return runs


def test_swapped_drafts_equal_fresh_engines(
    toy_fp8: Path, ptpc_fp8: Path, other_bf16: Path, fresh: dict[Path, dict[str, Any]]
) -> None:
    chain = [TOY / "draft", toy_fp8, ptpc_fp8, other_bf16, TOY / "draft"]
    roles = [(f"{i}-{d.name}", d) for i, d in enumerate(chain)]
    request = _request(toy_fp8)
    shared = run_shared(request, engine_prompts(request), roles)
    for (role, draft), engine in zip(roles, shared.values(), strict=True):
        assert engine["ok"], engine.get("refused") or engine["log"][-3000:]
        result = engine["result"]
        assert result["swapped"] is (role != roles[0][0])
        assert result["engine_config"]["llm"]["speculative_config"]["model"] == str(draft)
        if draft in fresh:
            assert _seen(result) == fresh[draft], role
    builds = {_build(e["result"]["draft_layers"]) for e in shared.values()}
    assert len(builds) == 3  # BF16, static FP8, PTPC FP8: three builds, each as when fresh


def _build(layers: list[dict[str, Any]]) -> tuple[tuple[Any, ...], ...]:
    """Each linear's scheme, weight dtype, weight scale count and whether its input is static."""
    return tuple(
        (x["scheme"], x["weight_dtype"], x.get("weight_scale", {}).get("count"), "input_scale" in x)
        for x in layers
    )


@pytest.mark.parametrize("mutant", ["no-reset", "old-weights"])
def test_a_faulty_swap_is_caught(
    mutant: str, toy_fp8: Path, other_bf16: Path, fresh: dict[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """The chain's other-weights -> BF16 step, which the test above passes, with a fault."""
    spec_path, out = tmp_path / "spec.json", tmp_path / "out.json"
    request = _request(toy_fp8)
    spec = shared_spec(request, engine_prompts(request), [other_bf16, TOY / "draft"])
    spec_path.write_text(json.dumps(spec.to_json()))
    env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    argv = [PYTHON, "-m", "tests.swap_mutants", mutant, str(spec_path), str(out)]
    run_child(argv, cwd=REPO, env=env)
    runs = json.loads(out.read_text())["runs"]
    assert runs[1]["token_ids"] == fresh[TOY / "draft"]["token_ids"]  # lossless all the same
    assert _seen(runs[1]) != fresh[TOY / "draft"]
    hits = runs[1]["metrics"]["prefix_cache_hits"]
    if mutant == "no-reset":
        assert hits > fresh[TOY / "draft"]["metrics"]["prefix_cache_hits"]
    else:
        assert hits == fresh[TOY / "draft"]["metrics"]["prefix_cache_hits"]


def test_a_swap_the_workers_refuse_falls_back_to_its_own_engine(
    toy_fp8: Path, tmp_path: Path
) -> None:
    """A difference only the workers see (not the shape validate reads first): the shared
    engine's first run stays, the refused draft gets its own engine, one line says why."""
    wider = tmp_path / "wider"
    shutil.copytree(TOY / "draft", wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 4096}))
    request = _request(toy_fp8)
    lines: list[str] = []
    roles = [("bf16", TOY / "draft"), ("wider", wider)]
    rendered = engine_prompts(request)

    def run_one(draft: Path | None, control: ControlTokens | None) -> EngineRun:
        return run_engine(request, draft, rendered, None, control)

    runs = run_single(request, rendered, roles, run_one, lines.append)
    reason = "the drafts differ in max_position_embeddings (2048 vs 4096)"
    assert runs.mode == "single" and runs.fallback == reason and runs.target_loads == 2
    assert runs.engines["bf16"]["shared_engine"] and not runs.engines["bf16"]["result"]["swapped"]
    assert runs.engines["wider"]["ok"] and "shared_engine" not in runs.engines["wider"]
    assert f"single engine refused ({reason}); separate engines for wider" in lines
