"""Predicting tune's k x concurrency surface from no speculation and one speculative k.

Two measured inputs, each named by where it comes from:

* **Acceptance by position** at the largest k (vLLM's counters:
  ``vllm:spec_decode_num_accepted_tokens_per_pos`` over ``vllm:spec_decode_num_drafts``).
  ``a_j``, the share of verify steps that accepted the j-th draft token, already is the
  product of the conditional rates up to j: a draft proposes its tokens one after another,
  so its first k' tokens do not depend on how many more it will propose. For any k' <= k the
  expected tokens per verify step are ``1 + a_1 + ... + a_k'``.
* **Time per step.** Without speculation a step at concurrency c serves c tokens, so the
  measured throughput gives the target's step time ``T(c) = c / throughput``. A straight
  line ``T(n) = alpha + beta * n`` in the number of tokens the target scores is fitted to
  those points. With speculation at k a step scores ``c * (k + 1)`` tokens and runs k draft
  steps: ``c * L(k) / throughput = T(c * (k + 1)) + k * D(c)`` gives the draft step time
  ``D(c)`` at each concurrency from the one speculative run.

Then for every (k, c): ``throughput = c * L(k) / (T(c * (k + 1)) + k * D(c))``. The
interval comes from the repeats' spread: the same fit on every run's slowest and fastest
measurements. Where it breaks: prefill-heavy loads (the model counts decode steps only),
and target steps past the token counts the no-speculation runs covered (``extrapolated``:
a linear step time is then an assumption, not a measurement). ``docs/release-table.md``
gives the equations with their inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean


@dataclass(frozen=True)
class Point:
    """One measured (k, concurrency): output throughput of each repeat (tokens/s) and, for a
    speculative k, acceptance by position (a_1 .. a_k)."""

    k: int
    concurrency: int
    runs: tuple[float, ...]
    per_position: tuple[float, ...] = ()


@dataclass(frozen=True)
class Prediction:
    k: int
    concurrency: int
    point: float
    low: float
    high: float
    extrapolated: bool  # the target's step past the token counts measured without speculation


@dataclass(frozen=True)
class StepModel:
    """``T(n) = alpha + beta * n`` seconds for a target step over n tokens, ``D(c)`` seconds
    per draft step at concurrency c, acceptance by position at ``k_max``."""

    alpha: float
    beta: float
    draft_step: Mapping[int, float]
    per_position: tuple[float, ...]
    k_max: int
    covered_tokens: int  # the most tokens a measured target step scored

    def throughput(self, k: int, concurrency: int) -> float:
        tokens = concurrency * (k + 1)
        step = self.alpha + self.beta * tokens + k * self.draft_step[concurrency]
        return concurrency * expected_length(self.per_position, k) / step


def expected_length(per_position: Sequence[float], k: int) -> float:
    """Tokens per verify step when proposing k: ``1 + a_1 + ... + a_k`` (k within the run)."""
    if not 0 <= k <= len(per_position):
        raise ValueError(f"k={k}: acceptance was measured for positions 1..{len(per_position)}")
    return 1.0 + sum(per_position[:k])


def fit_target_step(no_speculation: Iterable[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``alpha, beta`` of ``T(n) = alpha + beta * n`` from (concurrency,
    throughput) pairs of no-speculation runs (one step scores one token per request)."""
    pairs = [(float(c), c / throughput) for c, throughput in no_speculation]
    if len({n for n, _ in pairs}) < 2:
        raise ValueError("the target's step time needs no-speculation runs at 2+ concurrencies")
    mean_n, mean_t = fmean(n for n, _ in pairs), fmean(t for _, t in pairs)
    spread = sum((n - mean_n) ** 2 for n, _ in pairs)
    beta = sum((n - mean_n) * (t - mean_t) for n, t in pairs) / spread
    return mean_t - beta * mean_n, beta


def fit(points: Sequence[Point], pick: str = "mean") -> StepModel:
    """The step model from no-speculation points and the points of one speculative k; each
    point's throughput is its runs' ``mean``, ``min`` or ``max``."""
    picks: dict[str, Callable[[Sequence[float]], float]] = {"mean": fmean, "min": min, "max": max}
    choose = picks[pick]
    base = [p for p in points if p.k == 0]
    speculative = [p for p in points if p.k > 0]
    ks = {p.k for p in speculative}
    if len(ks) != 1:
        raise ValueError(f"one speculative k is fitted, got {sorted(ks)}")
    k_max = ks.pop()
    alpha, beta = fit_target_step((p.concurrency, choose(p.runs)) for p in base)
    per_position = speculative[0].per_position
    if len(per_position) != k_max:
        raise ValueError(f"k={k_max}: acceptance by position has {len(per_position)} entries")
    length = expected_length(per_position, k_max)
    draft_step = {}
    for p in speculative:
        step = p.concurrency * length / choose(p.runs)
        target = alpha + beta * p.concurrency * (k_max + 1)
        draft_step[p.concurrency] = max(0.0, (step - target) / k_max)
    return StepModel(alpha, beta, draft_step, per_position, k_max, max(p.concurrency for p in base))


def predict(points: Sequence[Point], ks: Iterable[int]) -> list[Prediction]:
    """Every (k, concurrency) for ``ks`` (0 included) at the measured speculative points'
    concurrencies, with the interval of the slowest- and fastest-run fits."""
    models = {pick: fit(points, pick) for pick in ("mean", "min", "max")}
    concurrencies = sorted(models["mean"].draft_step)
    found = []
    for k in sorted({0, *ks}):
        for c in concurrencies:
            values = [m.throughput(k, c) for m in models.values()]
            found.append(
                Prediction(
                    k=k,
                    concurrency=c,
                    point=models["mean"].throughput(k, c),
                    low=min(values),
                    high=max(values),
                    extrapolated=c * (k + 1) > models["mean"].covered_tokens,
                )
            )
    return found


def confirmation_plan(
    predictions: Sequence[Prediction], measured: set[tuple[int, int]]
) -> set[tuple[int, int]]:
    """What the recommendation rests on, not measured yet: at each concurrency the predicted
    best k and its neighbours in the grid (no speculation predicted best: the smallest k)."""
    plan: set[tuple[int, int]] = set()
    for c in sorted({p.concurrency for p in predictions}):
        row = sorted((p for p in predictions if p.concurrency == c), key=lambda p: p.k)
        ks = [p.k for p in row]
        best = ks.index(max(row, key=lambda p: p.point).k)
        for index in (best - 1, best, best + 1):
            if 0 <= index < len(ks):
                plan.add((ks[index], c))
        if ks[best] == 0 and len(ks) > 1:
            plan.add((ks[1], c))
    return {point for point in plan if point not in measured}
