"""Checks 2 and 5: the FP8 draft's acceptance against the BF16 draft's, with intervals over prompts.

Both checks come from one paired bootstrap of the two drafts' per-prompt counts
(``stats.py``): check 2 judges the ratio of mean acceptance length against
``min_acceptance_ratio``, check 5 each draft position's ratio of acceptance
rates against ``min_position_ratio``. :func:`acceptance_checks` takes the
counts of any subset of prompts (all of them, or one category's).

A sampled validation (``temperature`` above 0) judges the runs sampled after each draft's
greedy one (:func:`judged_counts`): each prompt's counts summed over its seeds, so the
bootstrap, resampling prompts, carries both the prompts' spread and the sampling's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eaglequant.results.engine_result import EngineResult, EngineRun, RequestCounts, SpecMetrics
from eaglequant.results.validation_report import INCONCLUSIVE, Check, CheckId, overall_verdict
from eaglequant.validate.stats import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Interval,
    PromptCounts,
    RatioIntervals,
    Verdict,
    bootstrap_ratios,
    counts_mismatch,
    judge,
    pooled_quantities,
)

ACCEPTANCE = CheckId.ACCEPTANCE
# A category's position is judged where the BF16 draft accepted at least this many tokens:
# below it the counts are too few for any interval (an FP8 run that happened to accept none
# of two would fail it outright).
MIN_POSITION_EVENTS = 10
PER_POSITION = CheckId.PER_POSITION


@dataclass(frozen=True, kw_only=True)
class AcceptanceThresholds:
    """The recipe's ratios and the bootstrap's settings."""

    min_acceptance_ratio: float
    min_position_ratio: float
    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED  # the bootstrap's
    temperature: float = 0.0  # the runs judged: greedy, or sampled with these seeds
    sampling_seeds: tuple[int, ...] = ()


def prompt_counts(result: EngineResult) -> list[PromptCounts]:
    """A speculative engine run's per-prompt counts (``engine_run``'s ``per_request``), held to
    the engine's own global counters; ValueError says what is wrong."""
    return held_counts(result["per_request"] or [], result["metrics"])


def held_counts(
    per_request: Sequence[RequestCounts | None], metrics: SpecMetrics
) -> list[PromptCounts]:
    """Per-prompt counts held to the counters ``metrics`` of the same run."""
    counts = [PromptCounts.from_json(p) for p in per_request if p is not None]
    if not counts or len(counts) != len(per_request):
        raise ValueError("vLLM reported no per-prompt spec-decode counts")
    mismatch = counts_mismatch(counts, metrics)
    if mismatch:
        raise ValueError(f"per-prompt counts disagree with vLLM's counters: {mismatch}")
    return counts


def judged_counts(result: EngineResult) -> list[PromptCounts]:
    """The per-prompt counts checks 2 and 5 judge: each prompt's summed over the run's sampled
    runs where it has them (each held to its own counters), else its greedy run's."""
    sampled = result.get("sampled")
    if not sampled:
        return prompt_counts(result)
    runs = []
    for run in sampled:
        try:
            runs.append(held_counts(run["per_request"], run["metrics"]))
        except ValueError as exc:
            raise ValueError(f"the run sampled with seed {run['seed']}: {exc}") from exc
    return [sum_counts(prompt) for prompt in zip(*runs, strict=True)]


def sum_counts(runs: Sequence[PromptCounts]) -> PromptCounts:
    """One prompt's counts over several runs: histograms and drafted tokens added."""
    width = max(len(r.histogram) for r in runs)
    histogram = [
        sum(r.histogram[j] if j < len(r.histogram) else 0 for r in runs) for j in range(width)
    ]
    return PromptCounts(tuple(histogram), sum(r.num_draft_tokens for r in runs))


def engine_acceptance_checks(
    engines: Mapping[str, EngineRun], thresholds: AcceptanceThresholds
) -> tuple[Check, Check]:
    """Checks 2 and 5 on the ``fp8`` and ``bf16`` engine runs (both failed when counts are bad)."""
    try:
        fp8, bf16 = (judged_counts(engines[role]["result"]) for role in ("fp8", "bf16"))
    except ValueError as exc:
        return Check(ACCEPTANCE, False, str(exc)), Check(PER_POSITION, False, str(exc))
    return acceptance_checks(fp8, bf16, thresholds)


def acceptance_checks(
    fp8: Sequence[PromptCounts],
    bf16: Sequence[PromptCounts],
    thresholds: AcceptanceThresholds,
    *,
    resample_steps: bool = False,
) -> tuple[Check, Check]:
    """Checks 2 and 5 on the two drafts' counts for the same prompts, in the same order
    (``resample_steps``: each prompt's verify steps resampled too, as for a category)."""
    ratios = bootstrap_ratios(
        fp8,
        bf16,
        paired=True,
        resamples=thresholds.resamples,
        seed=thresholds.seed,
        resample_steps=resample_steps,
    )
    k = len(ratios.per_position)
    values = {"fp8": pooled_quantities(fp8, k), "bf16": pooled_quantities(bf16, k)}
    # a category's position is judged only where the BF16 draft accepted enough there
    too_few = (
        [
            sum(p.accepted_per_pos(k)[position] for p in bf16) < MIN_POSITION_EVENTS
            for position in range(k)
        ]
        if resample_steps
        else [False] * k
    )
    return (
        _mean_length(values, ratios, thresholds, resample_steps),
        _per_position(values, ratios, thresholds, resample_steps, too_few),
    )


def _mean_length(
    values: dict[str, list[float]],
    ratios: RatioIntervals,
    thresholds: AcceptanceThresholds,
    steps: bool,
) -> Check:
    fp8, bf16 = values["fp8"][0], values["bf16"][0]
    threshold = thresholds.min_acceptance_ratio
    verdict = judge(ratios.mean_length, threshold)
    detail = (
        f"FP8 mean acceptance length {fp8:.3f} vs BF16 {bf16:.3f}: ratio "
        f"{_judged(ratios.mean_length, threshold)}; {_method(ratios, thresholds, steps)}"
    )
    numbers = {
        "fp8": fp8,
        "bf16": bf16,
        "ratio": ratios.mean_length.point,
        "interval": ratios.mean_length.to_json(),
        "threshold": threshold,
        "prompts_needed": verdict.prompts_needed,
        **_decoding(thresholds),
    }
    return Check.judged(ACCEPTANCE, verdict.verdict, detail, numbers)


def _per_position(
    values: dict[str, list[float]],
    ratios: RatioIntervals,
    thresholds: AcceptanceThresholds,
    steps: bool,
    too_few: list[bool],
) -> Check:
    fp8, bf16 = values["fp8"][1:], values["bf16"][1:]
    threshold = thresholds.min_position_ratio
    verdicts = [
        Verdict(INCONCLUSIVE) if few else judge(i, threshold)
        for i, few in zip(ratios.per_position, too_few, strict=True)
    ]
    detail = "; ".join(
        f"pos {p + 1}: FP8 {f:.3f} / BF16 {b:.3f}, ratio "
        + (
            f"{i.describe()}, not judged (the BF16 draft accepted under "
            f"{MIN_POSITION_EVENTS} tokens here)"
            if few
            else _judged(i, threshold)
        )
        for p, (f, b, i, few) in enumerate(
            zip(fp8, bf16, ratios.per_position, too_few, strict=True)
        )
    )
    numbers = {
        "fp8": fp8,
        "bf16": bf16,
        "threshold": threshold,
        "intervals": [i.to_json() for i in ratios.per_position],
        "verdicts": [v.verdict for v in verdicts],
        "prompts_needed": [v.prompts_needed for v in verdicts],
        **_decoding(thresholds),
    }
    verdict = overall_verdict([v.verdict for v in verdicts])
    detail = f"{detail}; {_method(ratios, thresholds, steps)}"
    return Check.judged(PER_POSITION, verdict, detail, numbers)


def _judged(interval: Interval, threshold: float) -> str:
    """``0.992 [0.983, 1.002], required >= 0.98: PASS`` (INCONCLUSIVE with its prompt count)."""
    verdict = judge(interval, threshold).describe()
    return f"{interval.describe()}, required >= {threshold}: {verdict}"


def _decoding(thresholds: AcceptanceThresholds) -> dict[str, float | list[int]]:
    """The runs judged, in a check's numbers: the temperature and (sampled) the seeds."""
    if not thresholds.temperature:
        return {"temperature": 0.0}
    return {
        "temperature": thresholds.temperature,
        "sampling_seeds": list(thresholds.sampling_seeds),
    }


def _method(ratios: RatioIntervals, thresholds: AcceptanceThresholds, steps: bool) -> str:
    interval = ratios.mean_length
    method = (
        f"95% paired-bootstrap interval over {interval.prompts} prompts "
        f"{'and their verify steps ' if steps else ''}"
        f"({interval.resamples} resamples, seed {interval.seed})"
    )
    if not thresholds.temperature:
        return method
    seeds = ", ".join(str(s) for s in thresholds.sampling_seeds)
    return (
        f"{method}; sampled at temperature {thresholds.temperature:g} with seeds {seeds}, "
        "each prompt's counts summed over its seeds"
    )
