"""Acceptance by category from per-prompt counts, and its table in the report."""

from __future__ import annotations

import pytest

from eaglequant.render.reports import category_markdown
from eaglequant.validate.categories import by_category, counts_acceptance


def _counts(histogram: list[int]) -> dict[str, object]:
    return {"histogram": histogram, "num_draft_tokens": 3 * sum(histogram)}


def test_summed_histograms_give_vllms_mean_and_per_position() -> None:
    # k=3; steps accepting 0..3 draft tokens: [2 steps j=0, 1 j=1, 0 j=2, 3 j=3] and [0, 0, 2, 2]
    acc = counts_acceptance([_counts([2, 1, 0, 3]), _counts([0, 0, 2, 2])])
    drafts, accepted = 10, 1 + 2 * 2 + 3 * 5
    assert acc["drafts"] == drafts and acc["accepted"] == accepted
    assert acc["mean_length"] == pytest.approx(1 + accepted / drafts)
    assert acc["per_position"] == pytest.approx([8 / 10, 7 / 10, 5 / 10])
    assert acc["draft_tokens"] == 30
    assert counts_acceptance([_counts([0, 0, 0, 0])])["mean_length"] is None


def test_small_categories_are_reported_not_judged() -> None:
    categories = ["math", "code", "math"]
    per_request = {
        "bf16": [_counts([0, 0, 0, 10]), _counts([1, 1, 1, 1]), _counts([0, 0, 0, 10])],
        "fp8": [_counts([10, 0, 0, 0]), _counts([1, 1, 1, 1]), _counts([0, 0, 0, 10])],
    }
    table = by_category(categories, per_request, min_drafts=40)
    assert list(table) == ["math", "code"]
    assert table["math"]["prompts"] == 2 and table["math"]["judged"]
    assert not table["code"]["judged"]  # 12 draft tokens per draft
    assert table["math"]["bf16"]["mean_length"] == 4.0
    assert table["math"]["fp8"]["mean_length"] == 2.5
    lines = category_markdown({"categories": table, "min_category_drafts": 40})
    assert lines[2].startswith("| math | 2 | 60 / 60 | 4.000 | 2.500 | 0.625 | 0.500:1.000 ")
    assert lines[3].endswith("| reported, not judged |")
    assert category_markdown({"categories": None}) == []
