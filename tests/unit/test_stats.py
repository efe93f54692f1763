"""The bootstrap and the verdict rule on per-prompt counts recorded from real vLLM runs."""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist

import pytest

from eaglequant.results.validation_report import FAIL, INCONCLUSIVE, PASS, overall_verdict
from eaglequant.validate import stats
from eaglequant.validate.stats import (
    Interval,
    PromptCounts,
    Verdict,
    bootstrap_length,
    bootstrap_ratios,
    counts_mismatch,
    judge,
    pooled_counts,
    prompts_for_half_width,
    student_t_quantile,
    tail_percent,
)
from tests.unit import recorded_counts as recorded


def _counts(rows: list[tuple[tuple[int, ...], int]]) -> list[PromptCounts]:
    return [PromptCounts(histogram, drafted) for histogram, drafted in rows]


BF16, FP8 = _counts(recorded.BF16), _counts(recorded.FP8)
COARSE, RANDOM = _counts(recorded.COARSE), _counts(recorded.RANDOM)


@pytest.mark.parametrize(
    ("prompts", "metrics"),
    [
        (BF16, recorded.BF16_METRICS),
        (FP8, recorded.FP8_METRICS),
        (COARSE, recorded.COARSE_METRICS),
        (RANDOM, recorded.RANDOM_METRICS),
    ],
)
def test_per_prompt_counts_sum_to_the_engines_counters(
    prompts: list[PromptCounts], metrics: dict
) -> None:
    assert pooled_counts(prompts).to_vllm() == metrics
    assert counts_mismatch(prompts, metrics) is None


def test_a_counter_mismatch_is_named() -> None:
    metrics = dict(recorded.FP8_METRICS, accepted_per_pos=[413, 332, 305])
    assert counts_mismatch(FP8, metrics) == (
        "accepted_per_pos [413, 332, 304] summed over prompts vs [413, 332, 305] counted by vLLM"
    )


def test_per_position_counts_come_from_the_histogram() -> None:
    prompt = PromptCounts((2, 3, 1, 4), 30)  # 10 steps
    assert (prompt.drafts, prompt.accepted) == (10, 3 + 2 + 12)
    assert prompt.accepted_per_pos(3) == [8, 5, 4]


def test_point_estimates_are_the_pooled_ratios() -> None:
    ratios = bootstrap_ratios(FP8, BF16, paired=True)
    fp8, bf16 = recorded.FP8_METRICS, recorded.BF16_METRICS
    length = (1 + fp8["num_accepted_tokens"] / fp8["num_drafts"]) / (
        1 + bf16["num_accepted_tokens"] / bf16["num_drafts"]
    )
    assert ratios.mean_length.point == pytest.approx(length)
    for p, interval in enumerate(ratios.per_position):
        rate = fp8["accepted_per_pos"][p] / fp8["num_drafts"]
        assert interval.point == pytest.approx(
            rate / (bf16["accepted_per_pos"][p] / bf16["num_drafts"])
        )
        assert interval.low <= interval.point <= interval.high
    assert ratios.mean_length.prompts == 32 and ratios.paired


def test_the_toy_fp8_export_clears_the_default_threshold() -> None:
    """Measured: 0.992 [0.982, 1.002] against 0.98."""
    interval = bootstrap_ratios(FP8, BF16, paired=True).mean_length
    assert (round(interval.point, 3), round(interval.low, 3), round(interval.high, 3)) == (
        0.992,
        0.982,
        1.002,
    )
    assert judge(interval, 0.98).verdict == PASS
    assert judge(interval, 0.95).verdict == PASS


def test_an_interval_straddling_the_threshold_is_inconclusive_with_a_prompt_count() -> None:
    """The coarse export: 0.991 [0.979, 1.002] against 0.98."""
    interval = bootstrap_ratios(COARSE, BF16, paired=True).mean_length
    assert interval.low < 0.98 <= interval.high
    verdict = judge(interval, 0.98)
    assert verdict.verdict == INCONCLUSIVE and not verdict.passed
    expected = prompts_for_half_width(interval, interval.point - 0.98)
    plain = math.ceil(32 * (interval.half_width / (interval.point - 0.98)) ** 2)
    assert 32 < expected <= plain  # the widening over 32 prompts shrinks as prompts are added
    assert verdict.prompts_needed == expected
    assert verdict.describe() == f"INCONCLUSIVE (about {expected} prompts would decide)"


def test_a_random_draft_clearly_fails() -> None:
    ratios = bootstrap_ratios(RANDOM, BF16, paired=True)
    assert ratios.mean_length.high < 0.4
    assert judge(ratios.mean_length, 0.98).verdict == FAIL
    assert [judge(i, 0.95).verdict for i in ratios.per_position] == [FAIL] * 3


def test_the_same_seed_gives_the_same_interval_and_another_seed_another() -> None:
    first = bootstrap_ratios(COARSE, BF16, paired=True, seed=7)
    assert bootstrap_ratios(COARSE, BF16, paired=True, seed=7) == first
    other = bootstrap_ratios(COARSE, BF16, paired=True, seed=8)
    assert other.mean_length.point == first.mean_length.point
    assert (other.mean_length.low, other.mean_length.high) != (
        first.mean_length.low,
        first.mean_length.high,
    )


def test_pairing_narrows_the_interval_of_mostly_equal_runs() -> None:
    """25 of the 32 prompts drafted identically under both drafts: pairing cancels them."""
    paired = bootstrap_ratios(FP8, BF16, paired=True).mean_length
    unpaired = bootstrap_ratios(FP8, BF16, paired=False).mean_length
    assert paired.point == unpaired.point
    assert paired.half_width * 4 < unpaired.half_width


def test_paired_runs_need_equal_prompt_counts() -> None:
    with pytest.raises(ValueError, match="equal prompt counts"):
        bootstrap_ratios(FP8[:10], BF16, paired=True)
    assert bootstrap_ratios(FP8[:10], BF16, paired=False).mean_length.prompts == 10


def _interval(point: float, low: float, high: float) -> Interval:
    return Interval(point, low, high, prompts=100, resamples=2000, seed=0)


@pytest.mark.parametrize(
    ("interval", "verdict", "needed"),
    [
        (_interval(0.99, 0.98, 1.0), PASS, None),  # the lower bound on the threshold passes
        (_interval(0.97, 0.96, 0.979), FAIL, None),
        (_interval(0.97, 0.96, 0.98), INCONCLUSIVE, 101),  # the upper bound on it does not fail
        (_interval(0.985, 0.975, 0.995), INCONCLUSIVE, 390),
        (_interval(0.98, 0.97, 0.99), INCONCLUSIVE, None),  # the estimate on the threshold
        (_interval(0.9801, 0.97, 0.99), INCONCLUSIVE, None),  # 1,000,000 prompts: not said
        (_interval(0.981, 0.971, 0.991), INCONCLUSIVE, 9663),  # 97x the prompts: still said
        (_interval(math.nan, math.nan, math.nan), INCONCLUSIVE, None),
    ],
)
def test_the_verdict_rule(interval: Interval, verdict: str, needed: int | None) -> None:
    judged = judge(interval, 0.98)
    assert (judged.verdict, judged.prompts_needed) == (verdict, needed)


def test_a_plain_interval_needs_its_prompts_by_the_square_root_rule_alone() -> None:
    # 10 prompts, half-width 0.25, the estimate 0.125 from the threshold: 4x the prompts halve it
    plain = Interval(1.0, 0.75, 1.25, prompts=10, resamples=2000, seed=0, expanded=False)
    assert prompts_for_half_width(plain, 0.125) == 40
    # the same width, expanded over 10 prompts, is wider than its normal width: fewer are needed
    expanded = replace(plain, expanded=True)
    assert 10 < prompts_for_half_width(expanded, 0.125) < 40


def test_a_categorys_intervals_are_plain_and_the_runs_expanded() -> None:
    by_steps = bootstrap_ratios(FP8[:10], BF16[:10], paired=True, resample_steps=True)
    assert not by_steps.mean_length.expanded and not by_steps.per_position[0].expanded
    assert bootstrap_ratios(FP8[:10], BF16[:10], paired=True).mean_length.expanded


def test_a_verdict_too_near_the_threshold_names_no_prompt_count() -> None:
    described = judge(_interval(0.9801, 0.97, 0.99), 0.98).describe()
    assert described == (
        "INCONCLUSIVE (the estimate sits at or too near the threshold: no practical prompt "
        "count decides)"
    )


def test_overall_verdict() -> None:
    assert overall_verdict([PASS, PASS]) == PASS
    assert overall_verdict([PASS, INCONCLUSIVE]) == INCONCLUSIVE
    assert overall_verdict([INCONCLUSIVE, FAIL, PASS]) == FAIL


def test_one_runs_length_interval_holds_its_point_and_narrows_to_it_when_prompts_agree() -> None:
    # 3 drafts each: 2 steps accepting 3, 1 step accepting 0 -> 1 + 6/3 = 3.0; 1 step of 1 -> 2.0
    prompts = [PromptCounts((1, 0, 0, 2), 9), PromptCounts((0, 1, 0, 0), 3)]
    interval = bootstrap_length(prompts, resamples=500, seed=1)
    assert interval.point == pytest.approx(1 + 7 / 4)
    assert 2.0 <= interval.low <= interval.point <= interval.high <= 3.0
    assert interval.low < interval.high
    same = bootstrap_length([PromptCounts((1, 0, 0, 2), 9)] * 5, resamples=200)
    assert (same.low, same.point, same.high) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError, match="at least one prompt"):
        bootstrap_length([])


@pytest.mark.parametrize(
    ("dof", "quantile"), [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (30, 2.042)]
)
def test_student_t_quantiles_match_the_tables(dof: int, quantile: float) -> None:
    assert student_t_quantile(0.975, dof) == pytest.approx(quantile, abs=5e-4)


@pytest.mark.parametrize("probability", [0.6, 0.9, 0.975, 0.999])
def test_many_degrees_take_the_expansion_which_agrees_with_the_exact_sum(
    probability: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    dof = stats.ASYMPTOTIC_DOF
    exact = student_t_quantile(probability, dof)  # the closed-form sum
    monkeypatch.setattr(stats, "ASYMPTOTIC_DOF", dof - 1)  # the same degrees by the expansion
    assert student_t_quantile(probability, dof) == pytest.approx(exact, abs=1e-11)
    # a million degrees: the normal quantile, at once
    normal = NormalDist().inv_cdf(probability)
    assert student_t_quantile(probability, 10**6) == pytest.approx(normal, abs=1e-5)


def test_the_interval_widens_over_few_prompts_and_not_over_many() -> None:
    assert tail_percent(2) == 0.0 and tail_percent(3) < 1e-4  # the widest resamples
    assert 0.5 < tail_percent(8) < 0.6 and 1.9 < tail_percent(32) < 2.0
    assert tail_percent(10_000) == pytest.approx(2.5, abs=0.01)


def test_two_prompts_fail_a_category_only_when_both_fall_below() -> None:
    """Over two prompts the interval spans both prompts' own ratios: one prompt at the
    threshold keeps a category undecided however far the other falls."""
    fine, half = PromptCounts((0, 0, 0, 10), 30), PromptCounts((5, 0, 0, 5), 30)
    one_each = bootstrap_ratios([half, fine], [fine, fine], paired=True).mean_length
    assert (one_each.low, one_each.high) == (pytest.approx(0.625), 1.0)
    assert judge(one_each, 0.98).verdict == INCONCLUSIVE
    both = bootstrap_ratios([half, half], [fine, fine], paired=True).mean_length
    assert judge(both, 0.98).verdict == FAIL


def test_one_prompt_decides_nothing() -> None:
    fine, half = PromptCounts((0, 0, 0, 10), 30), PromptCounts((5, 0, 0, 5), 30)
    interval = bootstrap_ratios([half], [fine], paired=True).mean_length
    assert (interval.low, interval.high) == (-math.inf, math.inf)
    assert judge(interval, 0.98) == Verdict(INCONCLUSIVE)
