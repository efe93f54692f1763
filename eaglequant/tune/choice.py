"""What tune recommends, decided on recorded measurements only (pure: no vLLM, no I/O).

Each point of the sweep is measured ``repeats`` times; ``runs`` is the list of
output tokens/s of those repeats. The rules:

- *beats*: A beats B when A's slowest repeat is faster than B's fastest (the
  min-max ranges do not overlap). Anything else is a tie: near-equal results
  are not told apart from run-to-run noise. With 3 repeats per side, complete
  separation by chance alone happens 1 time in 20.
- *winner* at one concurrency: no speculation (k 0) unless some k beats it;
  among the ks that beat it, the fastest on average, or the smallest k tied
  with that one.
- *schedule*: vLLM's ``num_speculative_tokens_per_batch_size`` built from the
  winners. Batch size b takes the winner of the smallest measured concurrency
  >= b, so with concurrencies c1 < c2 < ... ranges are [1, c1], [c1 + 1, c2],
  ...; adjacent ranges with the same k merge. vLLM carries the last range's k
  past the largest measured concurrency.
- a schedule given by the user instead must pass ``schedule_problem``, the
  rules vLLM's own validator applies, before any server starts.
- the schedule *holds* where the winner at that concurrency does not beat it.
- *best single* choice: the one k (0 included where asked) that ties or beats
  the winner at the most concurrencies, then the highest geometric-mean
  speedup, then the smallest k. A measured schedule that slipped somewhere
  still stands against it by the same two measures (``standing``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import fmean

Runs = Sequence[float]
# (concurrencies where the winner does not beat it, geometric-mean speedup): larger is better
Standing = tuple[int, float]
# (first batch size, last batch size, k), inclusive, as vLLM takes it.
Schedule = list[tuple[int, int, int]]


def beats(a: Runs, b: Runs) -> bool:
    """A is faster than B beyond the measured spread: A's slowest run beats B's fastest."""
    return min(a) > max(b)


def winner(runs: Mapping[int, Runs]) -> int:
    """The k to run at one concurrency (``runs``: k -> repeats, 0 = no speculation)."""
    faster = {k: r for k, r in runs.items() if k and beats(r, runs[0])}
    return smallest_tied(faster) if faster else 0


def smallest_tied(runs: Mapping[int, Runs]) -> int:
    """The smallest k that the fastest on average does not beat beyond the spread."""
    best = max(sorted(runs), key=lambda k: fmean(runs[k]))
    return min(k for k in runs if not beats(runs[best], runs[k]))


def schedule_from_winners(winners: Mapping[int, int]) -> Schedule:
    """Batch-size ranges from per-concurrency winners (concurrency -> k), merged where equal."""
    schedule: Schedule = []
    start = 1
    for concurrency in sorted(winners):
        k = winners[concurrency]
        if schedule and schedule[-1][2] == k:
            schedule[-1] = (schedule[-1][0], concurrency, k)
        else:
            schedule.append((start, concurrency, k))
        start = concurrency + 1
    return schedule


def schedule_problem(schedule: Sequence[Sequence[int]]) -> str | None:
    """What vLLM would refuse in a schedule, or (None) that it would take it, as a sentence."""
    if not schedule:
        return "give at least one range"
    if any(len(r) != 3 for r in schedule):
        return "give each range as (first batch size, last batch size, k)"
    if any(first < 1 or first > last or k < 0 for first, last, k in schedule):
        return "each range needs 1 <= first <= last and k >= 0"
    if schedule[0][0] != 1:
        return "the first range must start at batch size 1"
    if any(a[1] >= b[0] for a, b in itertools.pairwise(schedule)):
        return "ranges must be sorted and must not overlap"
    if not any(k for _, _, k in schedule):
        return "every k is 0: that is no speculation, which the sweep measures anyway"
    return None


def schedule_misses(
    schedule_runs: Mapping[int, Runs], winner_runs: Mapping[int, Runs]
) -> list[int]:
    """Concurrencies where the per-concurrency winner beats the schedule (empty: it held)."""
    return [c for c in sorted(winner_runs) if beats(winner_runs[c], schedule_runs[c])]


def best_single(sweep: Mapping[int, Mapping[int, Runs]], options: Iterable[int]) -> int:
    """The one k for every concurrency (``sweep``: concurrency -> k -> repeats), among the
    options measured at every concurrency (``tune --predict`` serves some ks at some only)."""
    options = [k for k in options if all(k in runs for runs in sweep.values())]
    return max(options, key=lambda k: (*standing(sweep, k_runs(sweep, k)), -k))


def k_runs(sweep: Mapping[int, Mapping[int, Runs]], k: int) -> dict[int, Runs]:
    """k's repeats at each concurrency of ``sweep``."""
    return {c: runs[k] for c, runs in sweep.items()}


def standing(sweep: Mapping[int, Mapping[int, Runs]], served: Mapping[int, Runs]) -> Standing:
    """How one configuration served at every concurrency (``served``: concurrency -> repeats;
    a single k, or a schedule) stands against ``sweep``: at how many concurrencies the
    winner does not beat it, then its geometric-mean speedup over no speculation."""
    winners = {c: winner(runs) for c, runs in sweep.items()}
    matched = sum(not beats(runs[winners[c]], served[c]) for c, runs in sweep.items())
    ratios = [fmean(served[c]) / fmean(runs[0]) for c, runs in sweep.items()]
    return matched, math.exp(fmean(math.log(r) for r in ratios))
