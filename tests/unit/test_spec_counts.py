"""One type for spec-decode counts: from vLLM's counters and per-request histograms, pooled,
differenced, and read as mean acceptance length and per-position rates."""

from __future__ import annotations

import pytest

from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.validate.stats import PromptCounts, counts_mismatch, pooled_counts


def test_a_histogram_gives_vllms_counters() -> None:
    # 10 verify steps at k=3: 4 accepted nothing, 3 one token, 2 two, 1 all three
    counts = SpecDecodeCounts.from_histogram([4, 3, 2, 1], draft_tokens=30)
    assert counts == SpecDecodeCounts(10, 30, 3 + 4 + 3, (6, 3, 1))
    assert counts.mean_acceptance_length == pytest.approx(2.0)
    assert counts.per_position_rates == pytest.approx([0.6, 0.3, 0.1])


def test_prompts_pool_to_the_engines_counters_and_a_difference_undoes_a_sum() -> None:
    prompts = [PromptCounts((4, 3, 2, 1), 30), PromptCounts((1, 0, 0, 1), 6)]
    pooled = pooled_counts(prompts)
    assert pooled == SpecDecodeCounts(12, 36, 13, (7, 4, 2))
    vllm = {"num_drafts": 12, "num_draft_tokens": 36, "num_accepted_tokens": 13}
    assert counts_mismatch(prompts, vllm | {"accepted_per_pos": [7, 4, 2]}) is None
    wrong = counts_mismatch(prompts, vllm | {"accepted_per_pos": [7, 4, 3]})
    assert wrong == "accepted_per_pos [7, 4, 2] summed over prompts vs [7, 4, 3] counted by vLLM"
    assert SpecDecodeCounts.from_vllm(pooled.to_vllm()) == pooled
    assert pooled - prompts[1].counts == prompts[0].counts
    # a shorter histogram (a run with fewer positions) is padded, not truncated
    assert (prompts[0].counts + SpecDecodeCounts(1, 1, 1, (1,))).accepted_per_position == (7, 3, 1)


def test_nothing_drafted_has_no_length_and_no_rates() -> None:
    assert SpecDecodeCounts.total([]) == SpecDecodeCounts()
    assert SpecDecodeCounts.from_vllm({}).mean_acceptance_length is None
    assert SpecDecodeCounts.from_vllm({}).per_position_rates == []
