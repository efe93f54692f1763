"""What ``eaglequant compare`` measured: one row per candidate recipe and prompt set, the
prompt sets, the recommendation; written as ``compare.json`` and read back by the card.
Torch-free: the card and its tests read it without vLLM."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eaglequant.errors import InputError
from eaglequant.recipe import DEFAULT_RECIPE
from eaglequant.results.manifest import check_schema, field_values, read_json_object
from eaglequant.results.validation_report import (
    CategoryRow,
    RatioInterval,
    categories_from_json,
    categories_json,
)
from eaglequant.results.workload import AcceptanceWorkload

COMPARE_JSON, COMPARE_MD = "compare.json", "compare.md"  # in ``eaglequant compare --out``
COMPARE_SCHEMA_VERSION = 3  # compare.json
RERUN_COMPARE = "re-run eaglequant compare"
SIZE_MARGIN = 0.05  # a passing candidate this much smaller than the default is recommended


@dataclass(frozen=True)
class CandidateRow:
    """One candidate's measured outcome on one prompt set (``passed``: all six checks under
    its recipe, a ready-made draft's under the default recipe's, by category too where the set
    has categories)."""

    recipe: str
    scheme: str
    kv_cache_dtype: str
    bytes_on_disk: int
    bytes_ratio: float
    quantized_fraction: float
    lossless: bool
    mean_acceptance: float | None
    per_position: list[float]
    acceptance_ratio: float | None
    min_acceptance_ratio: float
    passed: bool
    failed_checks: list[str]  # every check not passed: failed or inconclusive
    failure: str | None = None  # the first failed check's detail (an engine's: its log's cause)
    verdict: str = "FAIL"  # PASS, FAIL or INCONCLUSIVE (too few prompts decided a gate)
    prompt_set: str = ""  # the set's source as given
    categories: dict[str, CategoryRow] | None = None  # the validation report's
    min_category_drafts: int | None = None
    # FP8/BF16 with the intervals checks 2 and 5 judged (absent from files before they were)
    acceptance_interval: RatioInterval | None = None
    position_intervals: tuple[RatioInterval, ...] = ()
    ready_made: bool = False  # a quantized draft compared as given (``recipe``: its name)


@dataclass(frozen=True)
class PromptSetSummary:
    """One prompt set as compare ran it, with the BF16 draft's acceptance on it."""

    source: str
    sha256: str
    prompts: int
    baseline_mean_acceptance: float | None
    baseline_per_position: list[float]
    workload: AcceptanceWorkload | None = None  # what the acceptance was measured on


@dataclass(frozen=True)
class CompareReport:
    schema_version: int
    baseline: str
    target: str
    k: int
    max_tokens: int
    baseline_bytes: int
    prompt_sets: list[PromptSetSummary]
    rows: list[CandidateRow]  # one per candidate and prompt set, in the sets' order
    recommended: str | None
    timings_s: dict[str, float]
    engine_mode: str  # single (drafts swapped in one engine) or per-draft
    target_loads: int
    engine_fallback: str | None  # why some drafts had engines of their own
    recommendation_reason: str | None = None  # why ``recommended`` (absent from older files)

    def to_json(self) -> dict[str, Any]:
        data = {"tool": "eaglequant", **asdict(self)}
        for row, written in zip(self.rows, data["rows"], strict=True):
            written["categories"] = categories_json(row.categories)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], *, where: Path | str = COMPARE_JSON) -> CompareReport:
        """The report :meth:`to_json` wrote (its schema checked by the caller)."""
        try:
            fields_ = field_values(cls, data)
            fields_["prompt_sets"] = [_set_summary(s) for s in data["prompt_sets"]]
            fields_["rows"] = [_candidate_row(r) for r in data["rows"]]
            return cls(**fields_)
        except (KeyError, TypeError) as exc:
            raise InputError(
                f"{where}: not a complete comparison ({exc}); {RERUN_COMPARE}"
            ) from exc


def _set_summary(data: Mapping[str, Any]) -> PromptSetSummary:
    values = field_values(PromptSetSummary, data)
    if values.get("workload") is not None:
        values["workload"] = AcceptanceWorkload.from_json(values["workload"])
    return PromptSetSummary(**values)


def _candidate_row(data: Mapping[str, Any]) -> CandidateRow:
    values = field_values(CandidateRow, data)
    values["categories"] = categories_from_json(data.get("categories"))
    if values.get("acceptance_interval") is not None:
        values["acceptance_interval"] = RatioInterval.from_json(values["acceptance_interval"])
    values["position_intervals"] = tuple(
        RatioInterval.from_json(i) for i in values.get("position_intervals", ())
    )
    return CandidateRow(**values)


@dataclass(frozen=True)
class Recommendation:
    """The candidate compare recommends (its row on the first prompt set) and why."""

    row: CandidateRow
    reason: str


def recommend(
    rows: Sequence[CandidateRow], default: str = DEFAULT_RECIPE, margin: float = SIZE_MARGIN
) -> Recommendation | None:
    """The recipe the card asks for (``default``) when it passes on every prompt set, unless
    another candidate passing on every set is smaller by ``margin`` of its bytes or decidedly
    better in acceptance (:func:`decidedly_better`). Without a passing default, the smallest
    passing candidate (:func:`_smallest`)."""
    failed = {row.recipe for row in rows if not row.passed}
    by_recipe: dict[str, list[CandidateRow]] = {}
    for row in rows:
        by_recipe.setdefault(row.recipe, []).append(row)
    passing = {name: sets for name, sets in by_recipe.items() if name not in failed}
    if not passing:
        return None
    if default not in passing:
        chosen = _smallest([sets[0] for sets in passing.values()], margin, by_recipe)
        why = "did not pass" if default in by_recipe else "was not compared"
        return Recommendation(
            chosen,
            f"the default {default} {why}: the smallest candidate passing"
            + _on_every(rows)
            + f" (within {margin:.0%} of its bytes, the better acceptance vs BF16)",
        )
    reference = passing[default][0]
    others = [sets[0] for name, sets in passing.items() if name != default]
    smaller = [r for r in others if r.bytes_on_disk <= (1 - margin) * reference.bytes_on_disk]
    if smaller:
        chosen = _smallest(smaller, margin, by_recipe)
        return Recommendation(
            chosen,
            f"{_fewer(chosen, reference)} than the default {default}, passing{_on_every(rows)}",
        )
    better = [r for r in others if decidedly_better(by_recipe[r.recipe], by_recipe[default])]
    if better:
        chosen = max(better, key=lambda r: _low(r))
        return Recommendation(
            chosen,
            f"its acceptance vs BF16 is decidedly above the default {default}'s: "
            + _intervals(by_recipe[chosen.recipe], by_recipe[default]),
        )
    nearest = min(others, key=lambda r: r.bytes_on_disk, default=None)
    size = (
        f"; the smallest other passing candidate, {nearest.recipe}, is {_fewer(nearest, reference)}"
        if nearest is not None and nearest.bytes_on_disk < reference.bytes_on_disk
        else ""
    )
    return Recommendation(
        reference,
        f"the card's recipe, passing{_on_every(rows)}; no other passing candidate is "
        f"{margin:.0%} smaller or decidedly better in acceptance{size}",
    )


def decidedly_better(candidate: Sequence[CandidateRow], reference: Sequence[CandidateRow]) -> bool:
    """Whether ``candidate``'s acceptance interval vs BF16 lies wholly above ``reference``'s on
    some prompt set and wholly below it on none (both measured against the same BF16 run; a
    set without intervals decides nothing)."""
    theirs = {r.prompt_set: r.acceptance_interval for r in reference}
    above = below = False
    for row in candidate:
        mine, other = row.acceptance_interval, theirs.get(row.prompt_set)
        if mine is None or other is None:
            continue
        above |= mine.low > other.high
        below |= mine.high < other.low
    return above and not below


def _smallest(
    rows: Sequence[CandidateRow], margin: float, by_recipe: Mapping[str, list[CandidateRow]]
) -> CandidateRow:
    """The smallest of ``rows``; among those within ``margin`` of its bytes, the best mean
    acceptance ratio vs BF16 over the prompt sets (then the smaller, then the first given)."""
    least = min(r.bytes_on_disk for r in rows)
    near = [r for r in rows if (1 - margin) * r.bytes_on_disk <= least]

    def ratio(row: CandidateRow) -> float:
        sets = by_recipe[row.recipe]
        return sum(r.acceptance_ratio or 0.0 for r in sets) / len(sets)

    return max(near, key=lambda r: (ratio(r), -r.bytes_on_disk))


def _fewer(row: CandidateRow, reference: CandidateRow) -> str:
    """``1918136 bytes (7.6%) smaller``."""
    saved = reference.bytes_on_disk - row.bytes_on_disk
    share = saved / reference.bytes_on_disk
    return f"{saved} bytes ({f'{share:.1%}' if share >= 0.001 else 'under 0.1%'}) smaller"


def _low(row: CandidateRow) -> float:
    return row.acceptance_interval.low if row.acceptance_interval else 0.0


def _intervals(candidate: Sequence[CandidateRow], reference: Sequence[CandidateRow]) -> str:
    """Each prompt set's two intervals, ``mt-bench 1.020 [1.010, 1.030] vs 0.999 [...]``."""
    theirs = {r.prompt_set: r.acceptance_interval for r in reference}
    return "; ".join(
        f"{_set_name(row.prompt_set)} {mine.describe()} vs {other.describe()}"
        for row in candidate
        if (mine := row.acceptance_interval) and (other := theirs.get(row.prompt_set))
    )


def _set_name(source: str) -> str:
    """A prompt set file by its name alone: the reason goes into cards, which name no path."""
    return source.rstrip("/").rsplit("/", 1)[-1]


def _on_every(rows: Sequence[CandidateRow]) -> str:
    return " on every prompt set" if len({r.prompt_set for r in rows}) > 1 else ""


def read_compare_report(path: Path) -> CompareReport:
    """``compare.json`` as written; InputError naming the file for another tool's, another
    schema's or a malformed one."""
    data = read_json_object(path, "comparison")
    check_schema(path, data, "comparison", COMPARE_SCHEMA_VERSION, RERUN_COMPARE)
    return CompareReport.from_json(data, where=path)
