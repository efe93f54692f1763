"""Acceptance statistics over prompts: per-prompt counts, bootstrap intervals, one verdict rule.

Greedy decoding is deterministic, so a run's acceptance varies only with the
prompts it is measured on. Each prompt's verify steps are summarised by vLLM
as a histogram (``histogram[j]``: steps that accepted ``j`` draft tokens);
resampling prompts with replacement, and recomputing the pooled acceptance
(summed accepted over summed drafts) of each run, gives a percentile interval
for the ratio of two runs. When both runs drafted for the same prompts the
resampling is paired (the same prompts drawn for both), otherwise each run's
prompts are drawn on their own.

Over few prompts the plain percentile interval is too narrow (over two prompts the bootstrap
has three distinct resamples), so the percentiles are taken further out, as Hesterberg's
expanded percentile interval does: at the normal tail of sqrt(n / (n - 1)) x Student's t with
n - 1 degrees of freedom (:func:`tail_percent`). Over two or three prompts that is the widest
resample either way; over 32, the 1.9th and 98.1st percentiles in place of the 2.5th and
97.5th; one prompt gives no interval at all.

A prompt category holds a handful of prompts, too few for their spread to show how far each
prompt's own acceptance moves with its few dozen verify steps (two prompts that both happen to
fall below a threshold bound the widest resample). Its intervals (``resample_steps``)
therefore resample each drawn prompt's verify steps as well: a two-level bootstrap, prompts
and then the steps of each from its histogram, each draft's on their own, read at the plain
2.5th and 97.5th percentiles (the steps' own noise, not a widening, covers the few prompts).

:func:`judge` is the one rule turning an interval and a threshold into PASS,
FAIL or INCONCLUSIVE.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, TypedDict

import numpy as np

from eaglequant.results.engine_result import RequestCounts
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.results.validation_report import FAIL, INCONCLUSIVE, PASS

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
CONFIDENCE = 0.95
# An INCONCLUSIVE verdict names the prompt count that would decide only up to this many times
# the prompts run: beyond it the estimate sits too near the threshold for the count to mean much.
MAX_PROMPTS_FACTOR = 100
# Above this many degrees of freedom the t quantile comes from its expansion in 1 / dof.
ASYMPTOTIC_DOF = 1000


@dataclass(frozen=True)
class PromptCounts:
    """One prompt's verify steps: ``histogram[j]`` steps accepted ``j`` draft tokens."""

    histogram: tuple[int, ...]
    num_draft_tokens: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PromptCounts:
        return cls(tuple(int(c) for c in data["histogram"]), int(data["num_draft_tokens"]))

    def to_json(self) -> RequestCounts:
        return {"histogram": list(self.histogram), "num_draft_tokens": self.num_draft_tokens}

    @property
    def drafts(self) -> int:
        return sum(self.histogram)

    @property
    def accepted(self) -> int:
        return sum(j * count for j, count in enumerate(self.histogram))

    @property
    def counts(self) -> SpecDecodeCounts:
        return SpecDecodeCounts.from_histogram(self.histogram, self.num_draft_tokens)

    def accepted_per_pos(self, k: int) -> list[int]:
        """Steps that accepted draft position ``p`` (0-based), i.e. more than ``p`` tokens."""
        return [sum(self.histogram[p + 1 :]) for p in range(k)]


def positions(prompts: Sequence[PromptCounts]) -> int:
    """The number of draft positions (k) the histograms cover."""
    return max((len(p.histogram) - 1 for p in prompts), default=0)


def pooled_counts(prompts: Sequence[PromptCounts]) -> SpecDecodeCounts:
    """The run's totals: every prompt's counts summed."""
    return SpecDecodeCounts.total(p.counts for p in prompts)


def counts_mismatch(prompts: Sequence[PromptCounts], metrics: Mapping[str, Any]) -> str | None:
    """How the per-prompt sums differ from the engine's global counters (None: they agree)."""
    pooled = pooled_counts(prompts).to_vllm()
    wrong = [
        f"{key} {value} summed over prompts vs {metrics.get(key)} counted by vLLM"
        for key, value in pooled.items()
        if value != metrics.get(key)
    ]
    return "; ".join(wrong) or None


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap percentile interval over ``prompts`` prompts
    (``expanded``: at :func:`tail_percent`, widened for few prompts; else at the plain tails)."""

    point: float
    low: float
    high: float
    prompts: int
    resamples: int
    seed: int
    confidence: float = CONFIDENCE
    expanded: bool = True

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def describe(self) -> str:
        return f"{self.point:.3f} [{self.low:.3f}, {self.high:.3f}]"

    def to_json(self) -> dict[str, float]:
        return asdict(self)


class RatioIntervalsJson(TypedDict):
    """:class:`RatioIntervals` as a check's numbers hold them."""

    paired: bool
    mean_length: dict[str, float]  # an Interval's fields
    per_position: list[dict[str, float]]


@dataclass(frozen=True)
class RatioIntervals:
    """The ratio of two runs' mean acceptance length, and of each position's acceptance rate."""

    mean_length: Interval
    per_position: tuple[Interval, ...]
    paired: bool

    def to_json(self) -> RatioIntervalsJson:
        return {
            "paired": self.paired,
            "mean_length": self.mean_length.to_json(),
            "per_position": [i.to_json() for i in self.per_position],
        }


def _histograms(prompts: Sequence[PromptCounts], k: int) -> np.ndarray:
    """Each prompt's verify steps by tokens accepted (0 .. at least ``k``), one row a prompt."""
    width = max([k + 1, *(len(p.histogram) for p in prompts)])
    histograms = np.zeros((len(prompts), width))
    for index, prompt in enumerate(prompts):
        histograms[index, : len(prompt.histogram)] = prompt.histogram
    return histograms


def _step_rows(k: int, width: int) -> np.ndarray:
    """What one verify step that accepted j tokens (j < ``width``) adds to a prompt's row: one
    draft, j accepted tokens, and one at each of the ``k`` positions below j."""
    return np.array(
        [[1, j, *(float(p < j) for p in range(k))] for j in range(width)], dtype=np.float64
    )


def _matrix(prompts: Sequence[PromptCounts], k: int) -> np.ndarray:
    """Rows per prompt: drafts, accepted tokens, then accepted at each of the ``k`` positions."""
    histograms = _histograms(prompts, k)
    return histograms @ _step_rows(k, histograms.shape[1])


def _step_resampled(
    prompts: Sequence[PromptCounts], k: int, rng: np.random.Generator, resamples: int
) -> np.ndarray:
    """Per resample and prompt, :func:`_matrix`'s row of the prompt's verify steps drawn
    again with replacement from its histogram: shape (resamples, prompts, 2 + k)."""
    histograms = _histograms(prompts, k)
    row_of = _step_rows(k, histograms.shape[1])
    rows = np.zeros((resamples, len(prompts), 2 + k))
    for index, histogram in enumerate(histograms):
        steps = int(histogram.sum())
        if steps:
            draws = rng.multinomial(steps, histogram / steps, size=resamples)
            rows[:, index] = draws @ row_of
    return rows


def _quantities(sums: np.ndarray) -> np.ndarray:
    """Mean acceptance length and per-position rates from summed rows (last axis)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        drafts = sums[..., :1]
        length = 1 + sums[..., 1:2] / drafts
        rates = sums[..., 2:] / drafts
    return np.concatenate([length, rates], axis=-1)


def pooled_quantities(prompts: Sequence[PromptCounts], k: int) -> list[float]:
    """The run's mean acceptance length, then its acceptance rate at each of ``k`` positions."""
    return [float(v) for v in _quantities(_matrix(prompts, k).sum(axis=0))]


def student_t_quantile(probability: float, dof: int) -> float:
    """Student's t quantile for ``dof`` >= 1 degrees of freedom and ``probability`` in
    (0.5, 1): bisection on the closed-form distribution function for integer degrees
    (Abramowitz and Stegun 26.7.3-4), so no statistics library is needed; above
    :data:`ASYMPTOTIC_DOF` degrees (where that sum costs a term per degree) Fisher's expansion
    in 1 / dof (A&S 26.7.5), whose error there is below 1e-12."""
    if dof < 1 or not 0.5 < probability < 1:
        raise ValueError(f"t quantile needs dof >= 1 and 0.5 < p < 1 (got {dof}, {probability})")
    if dof > ASYMPTOTIC_DOF:
        z = NormalDist().inv_cdf(probability)
        terms = (
            (z**3 + z) / 4,
            (5 * z**5 + 16 * z**3 + 3 * z) / 96,
            (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
            (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
        )
        return z + sum(term / dof ** (power + 1) for power, term in enumerate(terms))
    central = 2 * probability - 1  # P(|T| < t)
    low, high = 0.0, 1.0
    while _t_central(high, dof) < central:
        low, high = high, high * 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if _t_central(middle, dof) < central else (low, middle)
    return (low + high) / 2


def _t_central(t: float, dof: int) -> float:
    """P(|T| < t) for Student's t with ``dof`` degrees of freedom."""
    theta = math.atan(t / math.sqrt(dof))
    cos2 = math.cos(theta) ** 2
    term, total = 1.0, 1.0
    if dof % 2:
        for j in range(1, (dof - 1) // 2):
            term *= cos2 * (2 * j) / (2 * j + 1)
            total += term
        series = math.sin(theta) * math.cos(theta) * total if dof > 1 else 0.0
        return 2 / math.pi * (theta + series)
    for j in range(1, dof // 2):
        term *= cos2 * (2 * j - 1) / (2 * j)
        total += term
    return math.sin(theta) * total


@functools.lru_cache(maxsize=512)
def tail_percent(prompts: int, confidence: float = CONFIDENCE) -> float:
    """The percentile each side of an interval over ``prompts`` prompts is taken at: the
    normal tail of sqrt(n / (n - 1)) x t(n - 1) (Hesterberg's expanded percentile interval),
    which is (1 - confidence) / 2 as prompts grow; 0 (the widest resample) when the tail is
    below 1e-9 percent."""
    if prompts < 2:
        raise ValueError("an interval needs at least two prompts")
    upper = 1 - (1 - confidence) / 2
    percent = 100 * NormalDist().cdf(-widening(prompts, confidence) * NormalDist().inv_cdf(upper))
    return percent if percent > 1e-9 else 0.0


def widening(prompts: int, confidence: float = CONFIDENCE) -> float:
    """How many times the normal interval's half-width the expanded one is over ``prompts``
    prompts: sqrt(n / (n - 1)) x t(n - 1) / z; 1.29 over 8 prompts, 1.04 over 32."""
    upper = 1 - (1 - confidence) / 2
    t = student_t_quantile(upper, prompts - 1)
    return math.sqrt(prompts / (prompts - 1)) * t / NormalDist().inv_cdf(upper)


def _percentiles(values: np.ndarray, prompts: int, *, expanded: bool = True) -> tuple[float, float]:
    """The interval of bootstrap ``values`` over ``prompts`` prompts (``expanded``: at
    :func:`tail_percent`, else at the plain tails): NaN without values, unbounded over one
    prompt (nothing to say how far a second one would land)."""
    if not values.size:
        return math.nan, math.nan
    if prompts < 2:
        return -math.inf, math.inf
    tail = tail_percent(prompts) if expanded else (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def _weights(rng: np.random.Generator, n: int, resamples: int) -> np.ndarray:
    """How often each of ``n`` prompts is drawn in each resample (n draws with replacement)."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)


def bootstrap_length(
    prompts: Sequence[PromptCounts],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Interval:
    """One run's mean acceptance length with its bootstrap interval over its prompts."""
    if not prompts:
        raise ValueError("bootstrap needs at least one prompt")
    matrix = _matrix(prompts, positions(prompts))
    weights = _weights(np.random.default_rng(seed), len(prompts), resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(_quantities(matrix.sum(axis=0))[0])
        lengths = _quantities(weights @ matrix)[:, 0]
    low, high = _percentiles(lengths[np.isfinite(lengths)], len(prompts))
    return Interval(point, low, high, len(prompts), resamples, seed)


def bootstrap_ratios(
    numerator: Sequence[PromptCounts],
    denominator: Sequence[PromptCounts],
    *,
    paired: bool,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    resample_steps: bool = False,
) -> RatioIntervals:
    """numerator / denominator of mean acceptance length and of each position's rate.

    ``paired``: both runs drafted for the same prompts, in the same order; each
    resample draws one set of prompt indices for both. Otherwise each run's
    prompts are resampled independently. ``resample_steps``: each drawn prompt's verify
    steps are drawn again too, from its histogram (each run's on their own). A ratio whose
    denominator is zero in a resample is left out of that quantity's interval.
    """
    if not numerator or not denominator:
        raise ValueError("bootstrap needs at least one prompt on each side")
    if paired and len(numerator) != len(denominator):
        raise ValueError(
            f"paired runs need equal prompt counts ({len(numerator)} vs {len(denominator)})"
        )
    k = max(positions(numerator), positions(denominator))
    top, bottom = _matrix(numerator, k), _matrix(denominator, k)
    rng = np.random.default_rng(seed)
    top_w = _weights(rng, len(numerator), resamples)
    bottom_w = top_w if paired else _weights(rng, len(denominator), resamples)
    if resample_steps:
        top_sums = np.einsum("rn,rnc->rc", top_w, _step_resampled(numerator, k, rng, resamples))
        bottom_sums = np.einsum(
            "rn,rnc->rc", bottom_w, _step_resampled(denominator, k, rng, resamples)
        )
    else:
        top_sums, bottom_sums = top_w @ top, bottom_w @ bottom
    with np.errstate(divide="ignore", invalid="ignore"):
        points = _quantities(top.sum(axis=0)) / _quantities(bottom.sum(axis=0))
        ratios = _quantities(top_sums) / _quantities(bottom_sums)
    ratios[~np.isfinite(ratios)] = np.nan
    n = min(len(numerator), len(denominator))
    intervals = []
    for column in range(1 + k):
        values = ratios[:, column]
        low, high = _percentiles(values[~np.isnan(values)], n, expanded=not resample_steps)
        intervals.append(
            Interval(
                float(points[column]), low, high, n, resamples, seed, expanded=not resample_steps
            )
        )
    return RatioIntervals(intervals[0], tuple(intervals[1:]), paired)


@dataclass(frozen=True)
class Verdict:
    """PASS, FAIL or INCONCLUSIVE; for INCONCLUSIVE, roughly how many prompts would decide."""

    verdict: str
    prompts_needed: int | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    def describe(self) -> str:
        if self.verdict != INCONCLUSIVE:
            return self.verdict
        if self.prompts_needed is None:
            return (
                f"{INCONCLUSIVE} (the estimate sits at or too near the threshold: no practical "
                "prompt count decides)"
            )
        return f"{INCONCLUSIVE} (about {self.prompts_needed} prompts would decide)"


def judge(interval: Interval, threshold: float) -> Verdict:
    """PASS when the interval lies at or above ``threshold``, FAIL when wholly below it, else
    INCONCLUSIVE with the prompt count at which the interval would stop straddling it.

    The interval's half-width shrinks about as 1/sqrt(prompts) (times its small-sample
    widening, :func:`widening`), so it clears the threshold once it is narrower than the
    estimate's distance from it (:func:`prompts_for_half_width`). Past ``MAX_PROMPTS_FACTOR`` times
    the prompts run, that extrapolation says nothing useful, and no count is given.
    """
    if interval.low >= threshold:
        return Verdict(PASS)
    if interval.high < threshold:
        return Verdict(FAIL)
    distance = abs(interval.point - threshold)
    if not math.isfinite(interval.half_width) or distance == 0 or not math.isfinite(distance):
        return Verdict(INCONCLUSIVE)
    needed = prompts_for_half_width(interval, distance)
    if needed > MAX_PROMPTS_FACTOR * interval.prompts:
        return Verdict(INCONCLUSIVE)
    return Verdict(INCONCLUSIVE, max(needed, interval.prompts + 1))


def prompts_for_half_width(interval: Interval, distance: float) -> int:
    """The prompts m at which ``interval``'s half-width, scaled as sqrt(n / m) (and, for an
    expanded interval, by the small-sample widening at m rather than at its n prompts), comes
    down to ``distance``."""
    n = interval.prompts
    if not interval.expanded:
        return math.ceil(n * (interval.half_width / distance) ** 2)
    at_normal_width = n * (interval.half_width / widening(n, interval.confidence) / distance) ** 2
    needed = at_normal_width
    for _ in range(8):  # widening(m) falls towards 1 as m grows: a few rounds settle it
        needed = at_normal_width * widening(max(2, math.ceil(needed)), interval.confidence) ** 2
    return math.ceil(needed)
