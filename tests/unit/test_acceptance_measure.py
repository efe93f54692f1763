"""``eaglequant acceptance``'s figure from an engine result: vLLM's counters, an interval over
prompts, the workload label; counts that disagree with the counters are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglequant.errors import EngineFailed
from eaglequant.results.engine_result import RequestCounts
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.validate.acceptance_length import AcceptanceRequest, measurement
from tests.support import engine_result
from tests.unit import recorded_counts as recorded

pytestmark = pytest.mark.unit

PER_REQUEST: list[RequestCounts | None] = [
    {"histogram": list(h), "num_draft_tokens": n} for h, n in recorded.BF16
]
REQUEST = AcceptanceRequest(
    target=Path("t"),
    draft=Path("d"),
    prompts=["p"] * len(recorded.BF16),
    prompt_set="prompts.jsonl",
    prompts_sha256="ab",
    k=3,
    max_tokens=48,
)


def test_the_figure_is_vllms_counters_with_an_interval_over_prompts() -> None:
    measured = measurement(REQUEST, engine_result(recorded.BF16_METRICS, PER_REQUEST))
    counted = SpecDecodeCounts.from_vllm(recorded.BF16_METRICS)
    assert measured.acceptance == counted.acceptance()
    assert measured.mean_length.point == pytest.approx(counted.mean_acceptance_length)
    assert measured.mean_length.low < measured.mean_length.point < measured.mean_length.high
    assert measured.mean_length.prompts == 32
    rates = ", ".join(f"{r:.3f}" for r in counted.per_position_rates)
    assert measured.describe().splitlines() == [
        f"mean acceptance length {measured.mean_length.describe()} (95% interval over 32 prompts)",
        f"per position: {rates}",
        "workload: prompts.jsonl (32 prompts), chat template, k=3, 48 tokens (EOS ignored), "
        "greedy, concurrency all",
    ]
    data = json.loads(json.dumps(measured.to_json()))
    assert (data["kind"], data["schema_version"]) == ("eaglequant.acceptance", 1)
    assert data["workload"] == REQUEST.workload.to_json()
    assert data["acceptance"] == counted.acceptance().to_json()


def test_counts_that_disagree_with_the_counters_are_refused() -> None:
    metrics = {**recorded.BF16_METRICS, "num_drafts": recorded.BF16_METRICS["num_drafts"] + 1}
    with pytest.raises(EngineFailed, match="per-prompt counts disagree with vLLM's counters"):
        measurement(REQUEST, engine_result(metrics, PER_REQUEST))  # type: ignore[arg-type]


def test_a_prompt_without_counts_is_refused() -> None:
    with pytest.raises(EngineFailed, match="vLLM reported no per-prompt spec-decode counts"):
        measurement(REQUEST, engine_result(recorded.BF16_METRICS, [*PER_REQUEST[:-1], None]))
