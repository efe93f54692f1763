"""``eaglequant acceptance`` reports the figure validate reports for the BF16 draft on the same
workload: the same engine run, the same counters, the same number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.validate.engine_summary import engine_summary
from eaglequant.validate.request import ValidateRequest
from eaglequant.validate.validation import read_prompts, run_engine
from tests.conftest import TOY, toy_prompts_file

pytestmark = pytest.mark.engine

PROMPTS, MAX_TOKENS, K = 8, 32, 3


def test_acceptance_equals_validates_bf16_figure(tmp_path: Path) -> None:
    prompts = toy_prompts_file(tmp_path / "prompts.jsonl", PROMPTS)
    out = tmp_path / "acceptance.json"
    args = ["acceptance", "--target", str(TOY / "target"), "--draft", str(TOY / "draft")]
    args += ["--prompts", str(prompts), "--k", str(K), "--max-tokens", str(MAX_TOKENS)]
    result = CliRunner().invoke(main, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    measured = json.loads(out.read_text())
    label = "(8 prompts), chat template, k=3, 32 tokens (EOS ignored), greedy, concurrency all"
    assert label in result.output.splitlines()[-1]

    request = ValidateRequest(
        target=TOY / "target",
        draft=TOY / "draft",
        baseline=TOY / "draft",
        prompts=read_prompts(TOY / "prompts.jsonl")[:PROMPTS],
        k=K,
        max_tokens=MAX_TOKENS,
        engine_timeout_s=300,
    )
    bf16 = engine_summary(run_engine(request, TOY / "draft")).acceptance
    assert bf16 is not None and bf16.drafts > 0
    assert measured["acceptance"] == bf16.to_json()
    interval = measured["mean_length"]
    assert interval["point"] == pytest.approx(bf16.mean_length)
    assert interval["low"] <= interval["point"] <= interval["high"]
    assert f"mean acceptance length {bf16.mean_length:.3f}" in result.output
