"""Acceptance by prompt category, from vLLM's per-request spec-decode counts.

Each prompt's counts (``per_request``: the histogram of accepted draft tokens
per verify step, and the draft tokens proposed) are summed over the prompts of
a category; mean acceptance length and acceptance by position follow as vLLM's
aggregate counters give them for the whole run. A category is judged by the
acceptance checks only when both drafts proposed at least the recipe's
``min_category_drafts`` draft tokens in it.
"""

from __future__ import annotations

from typing import Any


def counts_acceptance(counts: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean acceptance length and per-position acceptance of summed per-request counts."""
    width = max((len(c["histogram"]) for c in counts), default=0)
    histogram = [
        sum(c["histogram"][j] for c in counts if j < len(c["histogram"])) for j in range(width)
    ]
    drafts = sum(histogram)
    accepted = sum(j * n for j, n in enumerate(histogram))
    return {
        "mean_length": 1 + accepted / drafts if drafts else None,
        "per_position": [sum(histogram[i:]) / drafts for i in range(1, width)] if drafts else [],
        "drafts": drafts,
        "accepted": accepted,
        "draft_tokens": sum(c["num_draft_tokens"] for c in counts),
    }


def category_members(categories: list[str]) -> dict[str, list[int]]:
    """Prompt indices by category, categories in the order they first appear."""
    members: dict[str, list[int]] = {}
    for index, name in enumerate(categories):
        members.setdefault(name, []).append(index)
    return members


def by_category(
    categories: list[str], per_request: dict[str, list[dict[str, Any]]], min_drafts: int
) -> dict[str, dict[str, Any]]:
    """For each category: its prompt count, each draft's acceptance, and whether it is judged.

    ``per_request``: for each draft role (``bf16``, ``fp8``), one count record per prompt.
    """
    table = {}
    for name, indices in category_members(categories).items():
        row: dict[str, Any] = {"prompts": len(indices)}
        for role, counts in per_request.items():
            row[role] = counts_acceptance([counts[i] for i in indices])
        row["judged"] = all(row[role]["draft_tokens"] >= min_drafts for role in per_request)
        table[name] = row
    return table
