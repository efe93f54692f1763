"""What ``eaglequant compare`` measured: one row per candidate recipe and prompt set, the
prompt sets, the recommendation; written as ``compare.json`` and read back by the card.
Torch-free: the card and its tests read it without vLLM."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eaglequant.errors import InputError
from eaglequant.manifest import check_schema, field_values, read_json_object
from eaglequant.validation_report import (
    CategoryRow,
    RatioInterval,
    categories_from_json,
    categories_json,
)

COMPARE_JSON, COMPARE_MD = "compare.json", "compare.md"  # in ``eaglequant compare --out``
COMPARE_SCHEMA_VERSION = 3  # compare.json
RERUN_COMPARE = "re-run eaglequant compare"


@dataclass(frozen=True)
class CandidateRow:
    """One candidate's measured outcome on one prompt set (``passed``: all six checks under
    its recipe, by category too where the set has categories)."""

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


@dataclass(frozen=True)
class PromptSetSummary:
    """One prompt set as compare ran it, with the BF16 draft's acceptance on it."""

    source: str
    sha256: str
    prompts: int
    baseline_mean_acceptance: float | None
    baseline_per_position: list[float]


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
            fields_["prompt_sets"] = [
                PromptSetSummary(**field_values(PromptSetSummary, s)) for s in data["prompt_sets"]
            ]
            fields_["rows"] = [_candidate_row(r) for r in data["rows"]]
            return cls(**fields_)
        except (KeyError, TypeError) as exc:
            raise InputError(
                f"{where}: not a complete comparison ({exc}); {RERUN_COMPARE}"
            ) from exc


def _candidate_row(data: Mapping[str, Any]) -> CandidateRow:
    values = field_values(CandidateRow, data)
    values["categories"] = categories_from_json(data.get("categories"))
    if values.get("acceptance_interval") is not None:
        values["acceptance_interval"] = RatioInterval.from_json(values["acceptance_interval"])
    values["position_intervals"] = tuple(
        RatioInterval.from_json(i) for i in values.get("position_intervals", ())
    )
    return CandidateRow(**values)


def recommend(rows: Sequence[CandidateRow]) -> CandidateRow | None:
    """The smallest candidate on disk that passes on every prompt set; on equal size, the
    better mean acceptance (on the first set). Its row on the first set."""
    failed = {row.recipe for row in rows if not row.passed}
    first: dict[str, CandidateRow] = {}
    for row in rows:
        first.setdefault(row.recipe, row)
    passing = [row for name, row in first.items() if name not in failed]
    if not passing:
        return None
    return min(passing, key=lambda r: (r.bytes_on_disk, -(r.mean_acceptance or 0.0)))


def read_compare_report(path: Path) -> CompareReport:
    """``compare.json`` as written; InputError naming the file for another tool's, another
    schema's or a malformed one."""
    data = read_json_object(path, "comparison")
    check_schema(path, data, "comparison", COMPARE_SCHEMA_VERSION, RERUN_COMPARE)
    return CompareReport.from_json(data, where=path)
