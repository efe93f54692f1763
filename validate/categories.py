"""Acceptance by prompt category, from vLLM's per-request spec-decode counts.

Each prompt's counts (``per_request``) are pooled over the prompts of a
category (:func:`eaglequant.validate.stats.pooled_counts`), giving mean
acceptance length and acceptance by position as vLLM's aggregate counters give
them for the whole run. A category is judged only when both drafts proposed at
least the recipe's ``min_category_drafts`` draft tokens in it: then the FP8 /
BF16 ratios get paired bootstrap intervals over the category's prompts
(:func:`~eaglequant.validate.stats.bootstrap_ratios`) and the one verdict rule
(:func:`~eaglequant.validate.stats.judge`) decides check 2 (mean acceptance
length) and check 5 (every position) for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from eaglequant.validate.stats import (
    PromptCounts,
    bootstrap_ratios,
    judge,
    overall_verdict,
    pooled_counts,
)

ROLES = ("bf16", "fp8")


def category_members(categories: Sequence[str]) -> dict[str, list[int]]:
    """Prompt indices by category, categories in the order they first appear."""
    members: dict[str, list[int]] = {}
    for index, name in enumerate(categories):
        members.setdefault(name, []).append(index)
    return members


def by_category(
    categories: Sequence[str],
    per_request: dict[str, Sequence[PromptCounts]],
    *,
    min_drafts: int,
    threshold: float,
    acceptance: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """For each category: its prompts, each draft's acceptance (``acceptance`` of the pooled
    counts), whether it is judged and, if so, the ratio intervals and checks 2 and 5's verdicts.

    ``per_request``: for ``bf16`` and ``fp8``, one count record per prompt, in prompt order.
    """
    table = {}
    for name, indices in category_members(categories).items():
        counts = {role: [per_request[role][i] for i in indices] for role in ROLES}
        row: dict[str, Any] = {"prompts": len(indices)}
        for role in ROLES:
            pooled = pooled_counts(counts[role])
            row[role] = acceptance(pooled) | {"draft_tokens": pooled["num_draft_tokens"]}
        row["judged"] = all(row[role]["draft_tokens"] >= min_drafts for role in ROLES)
        if row["judged"]:
            row |= _verdicts(counts["fp8"], counts["bf16"], threshold)
        table[name] = row
    return table


def _verdicts(
    fp8: Sequence[PromptCounts], bf16: Sequence[PromptCounts], threshold: float
) -> dict[str, Any]:
    intervals = bootstrap_ratios(fp8, bf16, paired=True)
    positions = [judge(i, threshold).verdict for i in intervals.per_position]
    return {
        "ratio": intervals.to_json(),
        "verdicts": {
            "2": judge(intervals.mean_length, threshold).verdict,
            "5": overall_verdict(positions),
        },
    }


def category_summary(table: dict[str, dict[str, Any]], check: str) -> dict[str, list[str]]:
    """The judged categories by verdict for ``check`` (``2`` or ``5``), and those not judged."""
    summary: dict[str, list[str]] = {"not judged": []}
    for name, row in table.items():
        if not row["judged"]:
            summary["not judged"].append(name)
            continue
        summary.setdefault(row["verdicts"][check], []).append(name)
    return summary
