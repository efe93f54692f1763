"""Predicting tune's k x concurrency surface from two servers: no speculation and the largest k.

Two measured inputs, each named by where it comes from:

* **Acceptance by position** at the largest k, from the server's own counters
  (``vllm:spec_decode_num_accepted_tokens_per_pos`` over ``vllm:spec_decode_num_drafts``,
  deltas around the measurements). vLLM counts position j of a draft as accepted only when
  every position before it was (``SpecDecodingStats.observe_draft`` adds one to positions
  ``0 .. accepted - 1``), so ``a_j = accepted_per_pos[j] / drafts`` already is the probability
  that positions 1..j were all accepted, and ``L(k) = 1 + a_1 + ... + a_k`` the tokens per
  verify step at k. A smaller k' starts its steps at other places (after a full step more
  often than after a rejection), so its ``L(k')`` comes from :func:`predicted_length`.
* **Time per step.** Without speculation a step at concurrency c scores c tokens, so the
  measured throughput gives the target's step time ``T(c) = c / throughput``: the target's
  step time against tokens per step, at the concurrency grid's token counts. Between them
  ``T`` is interpolated linearly; past the largest it follows the last segment's slope
  (``extrapolated``). With speculation at k a step scores ``c * (k + 1)`` tokens and runs k
  draft steps: ``c * L(k) / throughput = T(c * (k + 1)) + k * D(c)`` gives the draft's step
  time ``D(c)`` at each concurrency from the one speculative server.

Then for every (k, c): ``throughput = c * L(k) / (T(c * (k + 1)) + k * D(c))``. It reproduces
both measured servers exactly, so an error in ``T`` past the measured token counts is shared
between the largest k (absorbed into ``D``) and the ks between. The interval is the same fit
on every point's slowest and on its fastest round. A prediction whose interval is wider than
:data:`MEANINGLESS_SPREAD` of its value says nothing a choice can rest on: it is ``noisy``,
and tune measures it instead where the choice rests on it (a tie with the winner) and some
value inside its interval would change the choice. Where the model breaks: prefill-heavy
loads (only decode steps are modelled), a k above the measured one (no ``a_j`` beyond
it), and the smallest ks where a speculative step's fixed cost outweighs a draft step (one
speculative server charges every draft step an equal share of it: k=1 comes out high).
``docs/release-table.md`` gives the equations with their inputs.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import fmean

from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.results.tune_summary import PredictedPoint
from eaglequant.tune.choice import (
    Runs,
    Schedule,
    best_single,
    schedule_from_winners,
    schedule_misses,
    winner,
)

# A prediction whose interval (high - low) exceeds this share of its value is too noisy to
# decide on: tune measures that point instead.
MEANINGLESS_SPREAD = 0.20


@dataclass(frozen=True)
class Point:
    """One measured (k, concurrency): output throughput of each round (tokens/s) and, for a
    speculative k, acceptance by position (a_1 .. a_k)."""

    k: int
    concurrency: int
    runs: tuple[float, ...]
    per_position: tuple[float, ...] = ()


def acceptance_by_position(counts: SpecDecodeCounts) -> tuple[float, ...]:
    """``a_j``: the share of drafts whose positions 1..j were all accepted (vLLM's counters:
    accepted at position j / drafts; a position counts only after every earlier one did)."""
    if not counts.drafts:
        raise ValueError("the speculative server counted no drafts: no acceptance to predict from")
    return tuple(counts.per_position_rates)


@dataclass(frozen=True)
class Prediction:
    k: int
    concurrency: int
    point: float
    low: float
    high: float
    extrapolated: bool  # the target's step past the token counts measured without speculation

    @property
    def spread(self) -> float:
        """The interval's width over the predicted value."""
        return (self.high - self.low) / self.point if self.point else float("inf")

    @property
    def noisy(self) -> bool:
        return self.spread > MEANINGLESS_SPREAD


def expected_length(per_position: Sequence[float], k: int) -> float:
    """Tokens per verify step when proposing k: ``1 + a_1 + ... + a_k`` (k within the run)."""
    if not 0 <= k <= len(per_position):
        raise ValueError(f"k={k}: acceptance was measured for positions 1..{len(per_position)}")
    return 1.0 + sum(per_position[:k])


def predicted_length(per_position: Sequence[float], k: int) -> float:
    """Tokens per verify step at k from acceptance by position measured at a larger K.

    ``1 + a_1 + ... + a_k`` of K's counters holds for the steps K took, but a smaller k starts
    more of its steps after a full step (all k accepted) and fewer right after a rejection,
    where the draft has just missed and misses more often: K's counters over-weight the hard
    positions. Modelled as a chain where the draft's first token is
    right with probability ``beta`` after a rejection and ``alpha^2 + (1 - alpha) beta`` (two
    positions on from a right one) after a full step, and every further position is right with
    probability ``alpha`` (the geometric fit ``(a_K / a_1)^(1 / (K - 1))``); ``beta`` is
    the one that reproduces K's ``a_1``. A step at k then accepts its first token with
    probability ``beta / (1 - s_k alpha (alpha - beta))`` (``s_j = a_j / a_1``, the shape of
    K's counters), its j-th with that times ``s_j``. At K itself it is K's own counters; where
    the fit has nothing to work with (K = 1, no first or last acceptance, a flat curve) the
    plain sum. On the real pair served (random prompts, K=8) it predicted k = 1-6 within 0-6%
    of each k's own counters, against up to 9% for the plain sum (docs/release-table.md).
    """
    top = len(per_position)
    plain = expected_length(per_position, k)
    if k in (0, top) or top < 2:
        return plain
    first, last = per_position[0], per_position[-1]
    if not 0 < last < first < 1:
        return plain
    alpha = (last / first) ** (1 / (top - 1))
    beta = (first - last * alpha**2) / (1 - last * alpha)
    shape = [rate / first for rate in per_position]
    first_at_k = beta / (1 - shape[k - 1] * alpha * (alpha - beta))
    return 1.0 + min(first_at_k, 1.0) * sum(shape[:k])


@dataclass(frozen=True)
class TargetStep:
    """The target's step time (s) against the tokens it scores, from no-speculation points:
    linear between the measured token counts, the last segment's slope past them."""

    tokens: tuple[float, ...]
    seconds: tuple[float, ...]

    @classmethod
    def measured(cls, no_speculation: Iterable[tuple[int, float]]) -> TargetStep:
        """From (concurrency, throughput) pairs of no-speculation runs (one token a request)."""
        pairs = sorted((float(c), c / throughput) for c, throughput in no_speculation)
        if len({n for n, _ in pairs}) != len(pairs) or len(pairs) < 2:
            raise ValueError("the target's step time needs no-speculation runs at 2+ concurrencies")
        return cls(tuple(n for n, _ in pairs), tuple(t for _, t in pairs))

    def __call__(self, tokens: float) -> float:
        n, t = self.tokens, self.seconds
        right = min(max(bisect.bisect_left(n, tokens), 1), len(n) - 1)
        slope = (t[right] - t[right - 1]) / (n[right] - n[right - 1])
        return t[right - 1] + slope * (tokens - n[right - 1])

    @property
    def covered(self) -> float:
        return self.tokens[-1]


@dataclass(frozen=True)
class StepModel:
    """``T(n)``: the target's step over n tokens, ``D(c)``: seconds per draft step at
    concurrency c, and acceptance by position at ``k_max`` at each concurrency."""

    target: TargetStep
    draft_step: Mapping[int, float]
    per_position: Mapping[int, tuple[float, ...]]
    k_max: int

    def throughput(self, k: int, concurrency: int) -> float:
        step = self.target(concurrency * (k + 1)) + k * self.draft_step[concurrency]
        return concurrency * predicted_length(self.per_position[concurrency], k) / step

    def scheduled_throughput(self, k: int, concurrency: int) -> float:
        """A per-batch-size schedule's range of k at this concurrency: one k's server where
        k > 0. Where k = 0 vLLM's drafter still runs its pass over each step's tokens to keep
        its KV cache in sync (``llm_base_proposer.propose``, "Dynamic SD decided K=0"): one
        draft step on top of the target's, for no accepted token; not no speculation."""
        if k:
            return self.throughput(k, concurrency)
        return concurrency / (self.target(concurrency) + self.draft_step[concurrency])


def fit(points: Sequence[Point], pick: str = "mean") -> StepModel:
    """The step model from no-speculation points and the points of one speculative k; each
    point's throughput is its rounds' ``mean``, ``min`` or ``max``."""
    picks: dict[str, Callable[[Sequence[float]], float]] = {"mean": fmean, "min": min, "max": max}
    choose = picks[pick]
    base = [p for p in points if p.k == 0]
    speculative = [p for p in points if p.k > 0]
    ks = {p.k for p in speculative}
    if len(ks) != 1:
        raise ValueError(f"one speculative k is fitted, got {sorted(ks)}")
    k_max = ks.pop()
    target = TargetStep.measured((p.concurrency, choose(p.runs)) for p in base)
    draft_step, per_position = {}, {}
    for p in speculative:
        if len(p.per_position) != k_max:
            raise ValueError(f"k={k_max}: acceptance by position has {len(p.per_position)} entries")
        step = p.concurrency * expected_length(p.per_position, k_max) / choose(p.runs)
        draft_step[p.concurrency] = max(0.0, (step - target(p.concurrency * (k_max + 1))) / k_max)
        per_position[p.concurrency] = p.per_position
    return StepModel(target, draft_step, per_position, k_max)


def predict(points: Sequence[Point], ks: Iterable[int]) -> list[Prediction]:
    """Every (k, concurrency) for ``ks`` (0 included) at the measured speculative points'
    concurrencies, with the interval of the slowest- and fastest-round fits."""
    models = {pick: fit(points, pick) for pick in ("mean", "min", "max")}
    mean = models["mean"]
    found = []
    for k in sorted({0, *ks}):
        for c in sorted(mean.draft_step):
            values = [m.throughput(k, c) for m in models.values()]
            found.append(
                Prediction(
                    k=k,
                    concurrency=c,
                    point=mean.throughput(k, c),
                    low=min(values),
                    high=max(values),
                    extrapolated=c * (k + 1) > mean.target.covered,
                )
            )
    return found


def predict_schedule(points: Sequence[Point], schedule: Schedule) -> dict[int, Runs]:
    """concurrency -> a schedule's predicted throughput there (``StepModel.scheduled_throughput``
    of the range holding it; vLLM carries the last range's k past it) as the rounds ``choice``
    decides on: the slowest- and fastest-round fits' values and the mean's."""
    models = {pick: fit(points, pick) for pick in ("mean", "min", "max")}
    found: dict[int, Runs] = {}
    for c in sorted(models["mean"].draft_step):
        k = next((k for first, last, k in schedule if first <= c <= last), schedule[-1][2])
        values = {pick: m.scheduled_throughput(k, c) for pick, m in models.items()}
        found[c] = (min(values.values()), values["mean"], max(values.values()))
    return found


def as_runs(prediction: Prediction) -> Runs:
    """A prediction as the rounds ``choice`` decides on: its interval's ends and its value."""
    return (prediction.low, prediction.point, prediction.high)


def predicted_sweep(predictions: Sequence[Prediction]) -> dict[int, dict[int, Runs]]:
    """concurrency -> k -> the prediction as runs, the shape ``choice`` reads."""
    sweep: dict[int, dict[int, Runs]] = {}
    for p in predictions:
        sweep.setdefault(p.concurrency, {})[p.k] = as_runs(p)
    return sweep


@dataclass(frozen=True)
class Plan:
    """What the predictions recommend and what is served to confirm it.

    ``winners``: concurrency -> the predicted k (0: no speculation), decided by the intervals,
    else the smaller k (``choice.winner``). ``schedule``: the per-batch-size schedule to serve
    where the winners differ and it holds as predicted (None: one k). ``single``: the one k
    recommended (the best single predicted k where the winners differ). ``noisy``: (k,
    concurrency) points the decision rests on (the winner and the ks its interval ties with)
    whose prediction is too noisy and could, somewhere inside its interval, change that
    decision. ``behind``: concurrency -> the winner that beats the winners' schedule there as
    predicted (``schedule`` is then None and ``single`` is served); ``scheduled``: that
    schedule's predicted runs by concurrency (empty where the winners agree).
    """

    winners: dict[int, int]
    single: int
    schedule: Schedule | None
    noisy: list[tuple[int, int]]
    behind: dict[int, int] = field(default_factory=dict)
    scheduled: dict[int, Runs] = field(default_factory=dict)


def plan(
    predictions: Sequence[Prediction],
    ks: Sequence[int],
    schedules: bool = True,
    scheduled: Callable[[Schedule], Mapping[int, Runs]] | None = None,
) -> Plan:
    """The recommendation from the predictions and the points to measure for it
    (``schedules``: False where vLLM turns per-batch-size schedules off; ``scheduled``: a
    schedule's predicted runs by concurrency, :func:`predict_schedule`, None: taken to hold)."""
    sweep = predicted_sweep(predictions)
    winners = {c: winner(runs) for c, runs in sweep.items()}
    single = best_single(sweep, (0, *ks))
    ranges = schedule_from_winners(winners)
    schedule = ranges if schedules and len(ranges) > 1 else None
    expected: dict[int, Runs] = {}
    behind: dict[int, int] = {}
    if schedule is not None and scheduled is not None:
        expected = dict(scheduled(schedule))
        misses = schedule_misses(expected, {c: sweep[c][k] for c, k in winners.items()})
        behind = {c: winners[c] for c in misses}
        schedule = None if behind else schedule
    by_point = {(p.k, p.concurrency): p for p in predictions}
    noisy = []
    for c, runs in sorted(sweep.items()):
        best = runs[winners[c]]
        for k in sorted(runs):
            tied = not (min(runs[k]) > max(best) or min(best) > max(runs[k]))
            if tied and by_point[k, c].noisy and _could_decide(k, winners[c], runs):
                noisy.append((k, c))
    return Plan(
        winners=winners,
        single=single,
        schedule=schedule,
        noisy=noisy,
        behind=behind,
        scheduled=expected,
    )


def _could_decide(k: int, chosen: int, runs: Mapping[int, Runs]) -> bool:
    """Whether some value inside k's interval would change the choice at this concurrency: a
    k above the chosen one must beat it, any other k must beat no speculation, and either
    needs its interval's top above its rival's (``choice.beats``). A point whose whole
    interval lies inside that tie changes nothing, however wide it is."""
    rival = runs[chosen] if k > chosen else runs[0]
    return k == 0 or max(runs[k]) > max(rival)


def predicted_point(
    prediction: Prediction, measured: Sequence[float] | None, fitted: bool
) -> PredictedPoint:
    """One prediction as results.json keeps it, beside its measured rounds (None: only
    predicted) and its error against their mean."""
    found = fmean(measured) if measured else None
    return {
        "k": prediction.k,
        "concurrency": prediction.concurrency,
        "point": prediction.point,
        "low": prediction.low,
        "high": prediction.high,
        "spread": prediction.spread,
        "noisy": prediction.noisy,
        "extrapolated": prediction.extrapolated,
        "measured": found,
        "measured_low": min(measured) if measured else None,
        "measured_high": max(measured) if measured else None,
        "error": None if found is None else prediction.point / found - 1,
        "fitted": fitted,
    }


def median_error(points: Iterable[PredictedPoint], more: Iterable[float] = ()) -> float | None:
    """The median absolute error over the points measured but not fitted, with ``more``
    errors besides (a served schedule's, one per concurrency); None where there are none."""
    found = [e for p in points if (e := p["error"]) is not None and not p["fitted"]]
    errors = sorted(abs(e) for e in [*found, *more])
    return errors[len(errors) // 2] if errors else None
