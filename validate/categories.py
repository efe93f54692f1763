"""Acceptance by prompt category, from vLLM's per-request spec-decode counts.

Each prompt's counts are pooled over the prompts of a category
(:func:`eaglequant.validate.stats.pooled_counts`), giving mean acceptance
length and acceptance by position as vLLM's aggregate counters give them for
the whole run. A category is judged only when both drafts proposed at least
the recipe's ``min_category_drafts`` draft tokens in it: then checks 2 and 5
run on its prompts alone (:func:`eaglequant.validate.acceptance_checks.acceptance_checks`,
the same paired bootstrap and verdict rule as for all prompts, with each prompt's verify
steps resampled too: a handful of prompts cannot show by their spread how far each one's
acceptance moves). The
regression gate (``validate --against``) runs per category too when both
reports have categories (:func:`category_regression`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace

from eaglequant.results.validation_report import (
    INCONCLUSIVE,
    PASS,
    CategoryRow,
    Check,
    CheckId,
    overall_verdict,
)
from eaglequant.validate.acceptance_checks import AcceptanceThresholds, acceptance_checks
from eaglequant.validate.regression import RunCounts, regression_check
from eaglequant.validate.stats import MAX_PROMPTS_FACTOR, PromptCounts, pooled_counts

ROLES = ("bf16", "fp8")
# A category's checks 2 and 5 (in CategoryRow.checks' order) over all categories.
CATEGORY_CHECKS = (CheckId.ACCEPTANCE_BY_CATEGORY, CheckId.PER_POSITION_BY_CATEGORY)
REGRESSION_BY_CATEGORY = CheckId.REGRESSION_BY_CATEGORY
NOT_JUDGED = "not judged"


def category_members(categories: Sequence[str]) -> dict[str, list[int]]:
    """Prompt indices by category, categories in the order they first appear."""
    members: dict[str, list[int]] = {}
    for index, name in enumerate(categories):
        members.setdefault(name, []).append(index)
    return members


def by_category(
    categories: Sequence[str],
    counts: Mapping[str, Sequence[PromptCounts]],
    *,
    min_drafts: int,
    thresholds: AcceptanceThresholds,
) -> dict[str, CategoryRow]:
    """For each category: its prompt count, each draft's acceptance (of the pooled counts, with
    the tokens drafted), whether it is judged and, if so, its checks 2 and 5.

    ``counts``: for ``bf16`` and ``fp8``, one record per prompt, in prompt order.
    """
    table = {}
    for name, indices in category_members(categories).items():
        subset = {role: [counts[role][i] for i in indices] for role in ROLES}
        pooled = {role: pooled_counts(subset[role]) for role in ROLES}
        judged = all(pooled[role].draft_tokens >= min_drafts for role in ROLES)
        table[name] = CategoryRow(
            prompts=len(indices),
            bf16=pooled["bf16"].acceptance(with_draft_tokens=True),
            fp8=pooled["fp8"].acceptance(with_draft_tokens=True),
            checks=(
                acceptance_checks(subset["fp8"], subset["bf16"], thresholds, resample_steps=True)
                if judged
                else None
            ),
        )
    return table


def category_checks(table: Mapping[str, CategoryRow]) -> list[Check]:
    """Checks 2 and 5 over the judged categories: FAIL if one fails, else INCONCLUSIVE if one
    is, else PASS; the detail names each category's verdict and those not judged, and each
    undecided category the prompt count that would decide it at its observed spread."""
    checks = []
    for which, name in enumerate(CATEGORY_CHECKS):
        by_verdict: dict[str, list[str]] = {}
        needed: dict[str, int | None] = {}
        for category, row in table.items():
            verdict = row.checks[which].verdict if row.checks else NOT_JUDGED
            by_verdict.setdefault(verdict, []).append(category)
            if row.checks and verdict == INCONCLUSIVE:
                needed[category] = prompts_to_decide(row.checks[which])
        judged = [v for v, names in by_verdict.items() if v != NOT_JUDGED for _ in names]
        verdict = overall_verdict(judged) if judged else PASS
        parts = [
            f"{v}: {', '.join(_named(n, needed) for n in names)}" for v, names in by_verdict.items()
        ]
        detail = "; ".join(parts) if judged else f"no category judged ({parts[0]})"
        numbers = {"categories": by_verdict, "prompts_to_decide": needed}
        checks.append(Check.judged(name, verdict, detail, numbers))
    return checks


def prompts_to_decide(check: Check) -> int | None:
    """The prompts an undecided check 2 or 5 would need at its observed spread (check 5: its
    slowest undecided position); None beyond ``MAX_PROMPTS_FACTOR`` times its prompts."""
    needed = check.numbers.get("prompts_needed")
    if not isinstance(needed, list):
        return needed if isinstance(needed, int) else None
    verdicts = check.numbers.get("verdicts", [])
    undecided = [n for n, v in zip(needed, verdicts, strict=True) if v == INCONCLUSIVE]
    return None if not undecided or None in undecided else max(undecided)


def _named(category: str, needed: Mapping[str, int | None]) -> str:
    """A category, with the prompts that would decide it when it is undecided."""
    if category not in needed:
        return category
    count = needed[category]
    if count is None:
        return (
            f"{category} (over {MAX_PROMPTS_FACTOR}x its prompts would not decide: its "
            "estimate sits at the threshold)"
        )
    return f"{category} (about {count} prompts would decide)"


def category_regression(
    current: RunCounts,
    previous: RunCounts,
    *,
    min_drafts: int,
    max_regression: float,
    resamples: int,
    seed: int,
) -> Check | None:
    """Check 7 per category both runs have (None unless both have categories): each category's
    FP8 acceptance against the earlier run's, judged when both drafted ``min_drafts`` tokens."""
    if current.categories is None or previous.categories is None:
        return None
    now, before = category_members(current.categories), category_members(previous.categories)
    results, not_judged = {}, []
    for name in (n for n in now if n in before):
        pair = (_subset(current, name, now[name]), _subset(previous, name, before[name]))
        if min(sum(p.num_draft_tokens for p in run.per_prompt) for run in pair) < min_drafts:
            not_judged.append(name)
            continue
        results[name] = regression_check(
            *pair, max_regression=max_regression, resamples=resamples, seed=seed
        )
    dropped = [name for name, check in results.items() if not check.passed]
    parts = [f"dropped beyond noise: {', '.join(dropped)}"] * bool(dropped)
    held = [name for name in results if name not in dropped]
    parts += [f"no drop beyond noise: {', '.join(held)}"] * bool(held)
    parts += [f"not judged (fewer than {min_drafts} draft tokens): {', '.join(not_judged)}"] * bool(
        not_judged
    )
    only = sorted(set(now) ^ set(before))
    parts += [f"in one run only: {', '.join(only)}"] * bool(only)
    numbers = {"categories": {n: asdict(c) for n, c in results.items()}, "not_judged": not_judged}
    detail = "; ".join(parts) or "no category in both runs"
    return Check(REGRESSION_BY_CATEGORY, not dropped, f"vs {previous.source}: {detail}", numbers)


def _subset(run: RunCounts, name: str, indices: list[int]) -> RunCounts:
    """One category's prompts of ``run``; subsets of equal prompt sets stay paired."""
    return replace(
        run,
        source=f"{run.source} [{name}]",
        prompts_sha256=f"{run.prompts_sha256}:{name}",
        per_prompt=tuple(run.per_prompt[i] for i in indices),
        categories=None,
    )
