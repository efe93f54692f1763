"""``validate --against PREVIOUS.json``: did this FP8 draft's acceptance drop below a shipped one's?

The gate compares this run's FP8 acceptance with the FP8 acceptance recorded in
an earlier validation report, overall (mean acceptance length) and at each
draft position, as the ratio this / previous with a bootstrap interval over
prompts:

- both reports ran the same prompts (equal ``prompts_sha256`` and
  ``max_tokens``): paired bootstrap, one draw of prompts for both runs;
- otherwise: each report's prompts resampled on their own (unpaired), which
  gives a wider interval; the check's detail says so.

A quantity fails when its whole interval lies below ``1 - max_regression``
(a drop beyond noise and beyond the tolerated drop); an interval reaching the
tolerated ratio is no proven drop and passes, its detail saying it is within
noise. Runs with equal generated tokens (``outputs_sha256``) and equal
per-prompt counts are "identical". Equal tokens alone prove nothing about
acceptance: speculative decoding is lossless, so any draft yields the
target's tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from eaglequant.errors import InputError
from eaglequant.results.validation_report import (
    FAIL,
    PASS,
    Check,
    CheckId,
    ValidationReport,
    read_report,
)
from eaglequant.validate.stats import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Interval,
    PromptCounts,
    bootstrap_ratios,
    judge,
    pooled_quantities,
)

NAME = CheckId.REGRESSION


@dataclass(frozen=True)
class RunCounts:
    """What the gate compares of one FP8 run: its prompts, outputs and per-prompt counts."""

    source: str
    k: int
    max_tokens: int
    prompts_sha256: str
    outputs_sha256: str
    per_prompt: tuple[PromptCounts, ...]
    categories: tuple[str, ...] | None = None  # one per prompt, when the prompts had them


def run_counts(report: ValidationReport, source: str) -> RunCounts:
    """The FP8 run of a validation report; InputError naming ``source``."""
    fp8 = report.engines.get("fp8")
    per_prompt = fp8.per_prompt if fp8 else None
    if fp8 is None or not fp8.ok or not per_prompt or fp8.outputs_sha256 is None:
        raise InputError(
            f"{source}: its FP8 engine run did not finish, so it holds no acceptance to compare "
            "with; pass a report whose FP8 engine ran"
        )
    try:
        # a prompt without counts (None) is refused as malformed, by the TypeError it raises
        counts = tuple(PromptCounts.from_json(cast("Mapping[str, Any]", p)) for p in per_prompt)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{source}: engines.fp8.per_prompt is malformed ({exc!r})") from exc
    return RunCounts(
        source=source,
        k=report.k,
        max_tokens=report.max_tokens,
        prompts_sha256=report.prompts_sha256,
        outputs_sha256=str(fp8.outputs_sha256),
        per_prompt=counts,
        categories=_categories(report, len(counts)),
    )


def _categories(report: ValidationReport, prompts: int) -> tuple[str, ...] | None:
    names = report.prompt_categories
    if not isinstance(names, list) or len(names) != prompts:
        return None
    return tuple(str(n) for n in names)


def read_previous(path: Path) -> RunCounts:
    """The FP8 run of the report at ``path`` (checked before any engine starts)."""
    return run_counts(read_report(path), str(path))


def check_comparable(previous: RunCounts, k: int) -> None:
    """Per-position acceptance compares only at the same ``num_speculative_tokens``."""
    if previous.k != k:
        raise InputError(
            f"{previous.source}: made with k={previous.k}, this run uses k={k}; compare runs "
            f"of the same k (pass --k {previous.k})"
        )


def regression_check(
    current: RunCounts,
    previous: RunCounts,
    *,
    max_regression: float,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Check:
    """Check 7: this run / the previous one, overall and per position, against the tolerance."""
    if (
        current.outputs_sha256 == previous.outputs_sha256
        and current.per_prompt == previous.per_prompt
    ):
        return Check(
            NAME,
            True,
            f"identical to {previous.source}: the same generated tokens (outputs_sha256 "
            f"{current.outputs_sha256[:12]}…) and the same acceptance on every prompt",
            {"identical": True, "previous": previous.source},
        )
    paired = (
        current.prompts_sha256 == previous.prompts_sha256
        and current.max_tokens == previous.max_tokens
        and len(current.per_prompt) == len(previous.per_prompt)
    )
    ratios = bootstrap_ratios(
        current.per_prompt, previous.per_prompt, paired=paired, resamples=resamples, seed=seed
    )
    threshold = 1 - max_regression
    quantities = [("mean acceptance length", ratios.mean_length)]
    quantities += [(f"position {p + 1}", i) for p, i in enumerate(ratios.per_position)]
    values = zip(
        pooled_quantities(current.per_prompt, current.k),
        pooled_quantities(previous.per_prompt, current.k),
        strict=True,
    )
    lines, drops = [], []
    for (label, interval), (now, before) in zip(quantities, values, strict=True):
        verdict = judge(interval, threshold).verdict
        line = _line(label, now, before, interval)
        if verdict == FAIL:
            drops.append(line)
        elif verdict != PASS:
            line += " (within noise)"
        lines.append(line)
    how = _method(current, previous, paired, resamples, seed)
    tolerance = f"tolerated drop {max_regression} (ratio >= {threshold:.3f})"
    numbers = {
        "identical": False,
        "previous": previous.source,
        "paired": paired,
        "max_regression": max_regression,
        "ratios": ratios.to_json(),
    }
    if drops:
        detail = f"dropped beyond noise vs {previous.source}: " + "; ".join(drops)
        return Check(NAME, False, f"{detail}; {tolerance}; {how}", numbers)
    detail = f"no drop beyond noise vs {previous.source}: " + "; ".join(lines)
    return Check(NAME, True, f"{detail}; {tolerance}; {how}", numbers)


def _line(label: str, now: float, before: float, interval: Interval) -> str:
    return f"{label} {now:.3f} vs {before:.3f} ({now - before:+.3f}), ratio {interval.describe()}"


def _method(
    current: RunCounts, previous: RunCounts, paired: bool, resamples: int, seed: int
) -> str:
    if paired:
        return (
            f"paired bootstrap over the same {len(current.per_prompt)} prompts "
            f"({resamples} resamples, seed {seed}, 95% interval)"
        )
    return (
        f"prompt sets differ (prompts_sha256 {current.prompts_sha256[:12]}… x "
        f"{current.max_tokens} tokens vs {previous.prompts_sha256[:12]}… x "
        f"{previous.max_tokens} tokens): unpaired bootstrap, {len(current.per_prompt)} and "
        f"{len(previous.per_prompt)} prompts resampled independently ({resamples} resamples, "
        f"seed {seed}, 95% interval)"
    )
