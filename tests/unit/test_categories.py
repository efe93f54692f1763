"""Acceptance by category from per-prompt counts, its verdicts, and its table in the report."""

from __future__ import annotations

import pytest

from eaglequant.render.validation_tables import category_markdown
from eaglequant.results.validation_report import CategoryRow
from eaglequant.validate.acceptance_checks import AcceptanceThresholds
from eaglequant.validate.categories import by_category, category_checks, category_regression
from eaglequant.validate.regression import RunCounts
from eaglequant.validate.stats import PromptCounts, bootstrap_ratios

THRESHOLDS = AcceptanceThresholds(min_acceptance_ratio=0.98, min_position_ratio=0.95)


def _counts(histogram: list[int]) -> PromptCounts:
    return PromptCounts(tuple(histogram), 3 * sum(histogram))


def _table(min_drafts: int) -> dict[str, CategoryRow]:
    # math: 4 prompts, FP8 accepts much less on each of them; code: one short prompt.
    categories = ["math", "code", "math", "math", "math"]
    full, half = [0, 0, 0, 10], [5, 0, 0, 5]
    per_request = {
        "bf16": [_counts(full), _counts([1, 1, 1, 1]), *[_counts(full)] * 3],
        "fp8": [_counts(half), _counts([1, 1, 1, 1]), _counts(half), _counts(half), _counts(half)],
    }
    return by_category(categories, per_request, min_drafts=min_drafts, thresholds=THRESHOLDS)


def test_pooled_category_counts_give_vllms_mean_and_per_position() -> None:
    table = _table(min_drafts=100)
    assert list(table) == ["math", "code"]
    math = table["math"]
    assert math.prompts == 4 and math.bf16.mean_length == 4.0
    assert math.fp8.mean_length == pytest.approx(1 + 4 * 15 / 40)
    assert math.fp8.per_position == pytest.approx([20 / 40] * 3)
    assert math.fp8.draft_tokens == 120
    assert math.judged and math.checks is not None
    assert [c.verdict for c in math.checks] == ["FAIL", "FAIL"]
    assert math.checks[0].name == "2 acceptance"
    assert not table["code"].judged and table["code"].checks is None  # 12 draft tokens


def test_a_failing_category_fails_checks_2_and_5_by_category() -> None:
    checks = category_checks(_table(min_drafts=100))
    assert [(c.name, c.verdict) for c in checks] == [
        ("2 acceptance by category", "FAIL"),
        ("5 per-position by category", "FAIL"),
    ]
    assert checks[0].detail == "FAIL: math; not judged: code"
    nothing_judged = category_checks(_table(min_drafts=10**6))
    assert [c.verdict for c in nothing_judged] == ["PASS", "PASS"]
    assert nothing_judged[0].detail == "no category judged (not judged: math, code)"


def test_category_table_in_the_markdown() -> None:
    lines = category_markdown(_table(min_drafts=100), 100)
    assert lines[2] == (
        "| math | 4 | 120 / 120 | 4.000 | 2.500 | 0.625 [0.475, 0.775] "
        "| 0.500:1.000 / 0.500:1.000 / 0.500:1.000 | 2 FAIL, 5 FAIL |"
    )
    assert lines[3].endswith("| reported, not judged |")
    assert lines[-2] == "Categories with fewer than 100 draft tokens are reported, not judged."
    assert category_markdown(None, None) == []


def _run(source: str, per_prompt: list[PromptCounts]) -> RunCounts:
    categories = ("math",) * 4 + ("code",) * 4 + ("tiny",)
    return RunCounts(source, 3, 32, "same-prompts", source, tuple(per_prompt), categories)


def test_the_regression_gate_judges_each_category_both_runs_have() -> None:
    full, half = _counts([0, 0, 0, 10]), _counts([5, 0, 0, 5])
    before = _run("previous.json", [full] * 8 + [_counts([1, 0, 0, 0])])
    now = _run("this run", [half] * 4 + [full] * 4 + [_counts([0, 1, 0, 0])])
    check = category_regression(
        now, before, min_drafts=60, max_regression=0.02, resamples=500, seed=0
    )
    assert check is not None and check.name == "7 regression by category"
    assert not check.passed
    assert check.detail == (
        "vs previous.json: dropped beyond noise: math; no drop beyond noise: code; "
        "not judged (fewer than 60 draft tokens): tiny"
    )
    assert check.numbers["categories"]["math"]["numbers"]["paired"] is True
    plain = RunCounts("old.json", 3, 32, "same-prompts", "x", before.per_prompt, None)
    assert (
        category_regression(now, plain, min_drafts=60, max_regression=0.02, resamples=500, seed=0)
        is None
    )


def test_an_undecided_category_names_the_prompts_that_would_decide_it() -> None:
    from eaglequant.results.validation_report import Check, CheckId
    from eaglequant.validate.categories import prompts_to_decide

    def row(two: Check, five: Check) -> CategoryRow:
        math = _table(min_drafts=100)["math"]
        return CategoryRow(prompts=10, bf16=math.bf16, fp8=math.fp8, checks=(two, five))

    passed = Check.judged(CheckId.ACCEPTANCE, "PASS", "", {"prompts_needed": None})
    two = Check.judged(CheckId.ACCEPTANCE, "INCONCLUSIVE", "", {"prompts_needed": 41})
    at_threshold = Check.judged(CheckId.ACCEPTANCE, "INCONCLUSIVE", "", {"prompts_needed": None})
    five = Check.judged(
        CheckId.PER_POSITION,
        "INCONCLUSIVE",
        "",
        {"prompts_needed": [None, 35, 120], "verdicts": ["PASS", "INCONCLUSIVE", "INCONCLUSIVE"]},
    )
    five_passed = Check.judged(
        CheckId.PER_POSITION, "PASS", "", {"prompts_needed": [None] * 3, "verdicts": ["PASS"] * 3}
    )
    assert (prompts_to_decide(two), prompts_to_decide(five)) == (41, 120)  # its slowest position
    assert prompts_to_decide(at_threshold) is None
    table = {
        "writing": row(passed, five_passed),
        "reasoning": row(at_threshold, five),
        "stem": row(two, five_passed),
    }
    acceptance, per_position = category_checks(table)
    assert acceptance.detail == (
        "PASS: writing; INCONCLUSIVE: reasoning (over 100x its prompts would not decide: its "
        "estimate sits at the threshold), stem (about 41 prompts would decide)"
    )
    assert acceptance.numbers["prompts_to_decide"] == {"reasoning": None, "stem": 41}
    assert per_position.detail == (
        "PASS: writing, stem; INCONCLUSIVE: reasoning (about 120 prompts would decide)"
    )


def test_two_prompts_a_little_below_by_their_steps_noise_leave_a_category_undecided() -> None:
    """Recorded on the real pair (fp8-dynamic, MT-Bench, k=5): coding's two prompts fell to
    0.955 and 0.907 of the BF16 draft's acceptance over 26 to 38 verify steps each, while the
    whole run was 0.971 [0.940, 0.997]. Their spread alone bounds 0.907-0.955 (FAIL against
    0.98); with each prompt's steps resampled the category is undecided."""
    bf16 = [_counts([6, 9, 6, 2, 2, 1]), _counts([19, 9, 4, 1, 1, 1])]
    fp8 = [_counts([6, 9, 7, 2, 2, 0]), _counts([23, 10, 1, 3, 1, 0])]
    table = by_category(
        ["coding", "coding"], {"bf16": bf16, "fp8": fp8}, min_drafts=1, thresholds=THRESHOLDS
    )
    coding = table["coding"]
    assert coding.checks is not None
    two, five = coding.checks
    assert two.verdict == "INCONCLUSIVE" and five.verdict != "FAIL", (two.detail, five.detail)
    assert "over 2 prompts and their verify steps" in two.detail
    plain = bootstrap_ratios(fp8, bf16, paired=True).mean_length
    assert plain.high < 0.98  # the prompts' spread alone would fail it
