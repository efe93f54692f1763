"""The baseline comparison's plan and verdicts, on recorded numbers only (pure: no I/O).

- *rounds*: every configuration is measured once per round; round r serves them
  starting at configuration r mod n (n configurations) and wrapping around, so
  drift over the run and the first-served position hit each alike.
- *duel*: A beats B when A's slowest repeat is faster than B's fastest
  (``choice.beats``); otherwise they tie.
- *choice* at one concurrency: no speculation unless a draft beats it; the draft
  where it beats no speculation and the baseline does not beat it; else the
  baseline where that beats no speculation.
- *recommendation*: the choices over the concurrencies in one sentence, e.g.
  "serve the draft at every measured concurrency", "serve the baseline at
  concurrency >= 32; the draft at concurrency <= 16", or "no speculation".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from eaglequant.results.tune_summary import BASELINE, DRAFT, NO_SPECULATION
from eaglequant.tune.choice import Runs, beats, smallest_tied

T = TypeVar("T")


def rounds(configurations: Sequence[T], repeats: int) -> list[list[T]]:
    """The serving order of each round: round r starts at configuration r mod n."""
    n = len(configurations)
    return [[configurations[(r + i) % n] for i in range(n)] for r in range(repeats)]


def duel(a: Runs, b: Runs, a_name: str, b_name: str) -> str:
    """The name of the one that beats the other beyond the spread, or "tie"."""
    if beats(a, b):
        return a_name
    if beats(b, a):
        return b_name
    return "tie"


def choose(none: Runs, baseline: Runs, draft: Runs) -> str:
    """What to serve at one concurrency, given each configuration's repeats."""
    if beats(draft, none) and not beats(baseline, draft):
        return DRAFT
    if beats(baseline, none):
        return BASELINE
    return NO_SPECULATION


def verdict_text(draft_vs_baseline: str, draft_vs_none: str, baseline_vs_none: str) -> str:
    """One table cell: the draft against the baseline, then each against no speculation."""
    first = {
        DRAFT: "draft beats baseline",
        BASELINE: "baseline beats draft",
        "tie": "draft ties baseline",
    }[draft_vs_baseline]
    outcome = {"tie": "ties", NO_SPECULATION: "loses"}
    draft = outcome.get(draft_vs_none, "wins")
    baseline = outcome.get(baseline_vs_none, "wins")
    return f"{first}; vs no speculation: draft {draft}, baseline {baseline}"


def best_by_concurrency(
    choices: Mapping[int, Mapping[int, str]], runs: Mapping[tuple[str, int, int], Runs]
) -> dict[int, str]:
    """Across ks: concurrency -> "draft k=3" / "baseline k=4" / "no speculation".

    ``choices``: concurrency -> k -> choice; ``runs``: (role, k, concurrency) -> repeats.
    No speculation only where every k chose it; otherwise, among the ks that chose a draft,
    the smallest the fastest on average does not beat beyond the spread
    (``choice.smallest_tied``, as the sweep's winner).
    """
    best: dict[int, str] = {}
    for concurrency, by_k in choices.items():
        picked = {
            k: runs[role, k, concurrency] for k, role in by_k.items() if role != NO_SPECULATION
        }
        if not picked:
            best[concurrency] = NO_SPECULATION
            continue
        k = smallest_tied(picked)
        best[concurrency] = f"{by_k[k]} k={k}"
    return best


def recommendation(best: Mapping[int, str]) -> str:
    """The per-concurrency choices as one sentence (concurrency ranges where contiguous)."""
    order = sorted(best)
    names = list(dict.fromkeys(best[c] for c in order))
    if len(names) == 1:
        name = names[0]
        if name == NO_SPECULATION:
            return "no speculation: no draft beat it beyond the spread at any measured concurrency"
        return f"serve the {name} at every measured concurrency"
    parts = []
    for name in names:
        levels = [c for c in order if best[c] == name]
        what = NO_SPECULATION if name == NO_SPECULATION else f"the {name}"
        parts.append(f"{what} at {_levels(levels, order)}")
    return "serve " + "; ".join(parts)


def _levels(levels: list[int], order: list[int]) -> str:
    if levels == order[-len(levels) :]:
        return f"concurrency >= {levels[0]}"
    if levels == order[: len(levels)]:
        return f"concurrency <= {levels[-1]}"
    return "concurrency " + ", ".join(map(str, levels))
