"""The typed form of tune's ``results.json``: what is written, and what render/ reads back.

Two kinds share one schema version: a ``sweep`` (no speculation and each k of one
draft, with the schedule) and a ``comparison`` (``--baseline``: no speculation,
the baseline draft and the draft under one set of serve arguments, in rotated
rounds). ``check_summary`` turns an older or foreign file into one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

from eaglequant.errors import InputError
from eaglequant.results.environment import EnvironmentRecord

if TYPE_CHECKING:
    from typing import NotRequired

    from eaglequant.results.workload import WorkloadJson

SCHEMA_VERSION = 2
SWEEP: Literal["sweep"] = "sweep"
COMPARISON: Literal["comparison"] = "comparison"
# The three configurations of a comparison, by these names in code, files and tables.
NO_SPECULATION = "no speculation"
BASELINE = "baseline"
DRAFT = "draft"
ROLES = (NO_SPECULATION, BASELINE, DRAFT)


class Acceptance(TypedDict):
    """Acceptance pooled over a point's repeats, from the /metrics deltas."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: list[int]
    mean_length: float | None
    per_position: list[float]
    # Each repeat's mean acceptance length as /metrics and as the bench's file gave it.
    lengths: list[float | None]
    bench_lengths: list[float | None]


class Point(TypedDict):
    """One configuration at one k and concurrency, over its repeats (in round order)."""

    role: str
    k: int
    concurrency: int
    runs: list[float]
    output_throughput: float
    throughput_min: float
    throughput_max: float
    per_device: float
    speedup: float
    speedup_min: float
    speedup_max: float
    median_tpot_ms: float | None
    median_ttft_ms: float | None
    acceptance: Acceptance | None


class Verdict(TypedDict):
    """Who beat whom at one k and concurrency (beyond the repeats' spread), and the choice."""

    k: int
    concurrency: int
    draft_vs_baseline: str
    draft_vs_none: str
    baseline_vs_none: str
    choice: str
    text: str


class Round(TypedDict):
    round: int
    order: list[str]


class ServerStart(TypedDict):
    label: str
    round: int | None
    start_s: float


class ServeLine(TypedDict):
    label: str
    line: str


class Recommendation(TypedDict):
    """The sentence, the choice by concurrency, and the draft's k for a usage line.

    ``k`` is the draft's k where the draft is chosen somewhere (the most often chosen),
    else 0; ``schedule`` is always false (a comparison serves single ks).
    """

    text: str
    by_concurrency: dict[str, str]
    k: int
    schedule: bool


class Workload(TypedDict):
    """What was served and driven, shared by both kinds."""

    target: str
    draft: str
    ks: list[int]
    concurrencies: list[int]
    isl: int
    osl: int
    repeats: int
    prompts: str | None
    dataset: str
    max_model_len: int
    tensor_parallel_size: int
    engine_args: dict[str, Any]
    command: str | None


class SweepRow(TypedDict):
    """One server (a single k, 0: no speculation, or the schedule's) at one concurrency, over
    its repeats: throughput, its spread and speedup, latency and acceptance as the bench gave
    them."""

    k: int
    concurrency: int
    runs: list[float]
    mean_tpot_ms: float | None
    acceptance_length: float | None
    per_position: list[float]
    schedule: bool
    output_throughput: float
    throughput_min: float
    throughput_max: float
    speedup: float | None
    # What its acceptance was measured on (a single k's rows; absent from older results).
    workload: NotRequired[WorkloadJson | None]


class SweepSchedule(TypedDict):
    """The per-batch-size schedule: its ranges ``[low, high, k]``, whether it was given or
    built from the winners, and its rows where it was served."""

    ranges: list[list[int]]
    given: bool
    measured: bool
    not_measured_because: str | None
    results: list[SweepRow]
    serve_command: str | None


class SweepRecommendation(TypedDict):
    """What a sweep recommends: ``choice`` single, none or schedule, its k, and why."""

    choice: Literal["single", "none", "schedule"]
    k: int
    schedule: bool
    reason: str


class PredictedPoint(TypedDict):
    """``tune --predict``: one (k, concurrency) predicted [low, high] (``spread``: the width
    over the value; ``noisy``: too wide to decide on), with what was measured there (None:
    only predicted) and the prediction's error against it; ``fitted``: its k was measured to
    fit the model."""

    k: int
    concurrency: int
    point: float
    low: float
    high: float
    spread: float
    noisy: bool
    extrapolated: bool
    measured: float | None
    measured_low: float | None
    measured_high: float | None
    error: float | None
    fitted: bool


class AcceptanceCheck(TypedDict):
    """``tune --predict``: at a k served besides the fit, the tokens per verify step the
    largest k's counters predicted there against what that k's own counters measured."""

    k: int
    concurrency: int
    predicted_length: float
    measured_length: float | None


class PredictedSchedule(TypedDict):
    """The winners' per-batch-size schedule as ``tune --predict`` predicted it: its ranges,
    its throughput by concurrency ([slowest, mean, fastest] fits) and where a winner beats
    it (concurrency -> k; not served then); where it was served, its measured rounds
    ([slowest, mean, fastest]) and the prediction's error by concurrency."""

    ranges: list[list[int]]
    runs: dict[str, list[float]]
    behind: dict[str, int]
    measured: NotRequired[dict[str, list[float]]]
    errors: NotRequired[dict[str, float]]


class PredictionRecord(TypedDict):
    """``tune --predict``'s block: the ks fitted on, every point, the predicted winner at each
    concurrency, the best single k and the schedule served (None: one k), the winners'
    schedule as predicted, what one confirmation server served (None: the recommendation
    was already measured), the ks measured because their prediction was too noisy, the
    median error where a prediction was then measured, and the server starts spent against
    the full sweep's."""

    fitted_on: list[int]
    points: list[PredictedPoint]
    winners: dict[str, int]
    single: int
    schedule: list[list[int]] | None
    schedule_predicted: NotRequired[PredictedSchedule | None]
    confirmed: str | None
    noisy_measured: list[int]
    acceptance_checks: list[AcceptanceCheck]
    median_abs_error: float | None
    server_starts: int
    full_sweep_server_starts: int


class RolePrediction(TypedDict):
    """``tune --predict --baseline``: one draft's predicted points (``role``: baseline or
    draft)."""

    role: str
    points: list[PredictedPoint]


class ComparisonPrediction(TypedDict):
    """``tune --predict --baseline``'s block: every k of the release table predicted for both
    drafts from no speculation and each draft at the largest k, the draft's k it recommends,
    the ks measured (the largest, the recommended, any too noisy to decide on), the median
    error where a prediction was then measured, and the server starts against the full
    table's (each configuration served once)."""

    fitted_on: list[int]
    ks: list[int]
    roles: list[RolePrediction]
    recommended_k: int
    measured_ks: list[int]
    noisy_measured: list[int]
    median_abs_error: float | None
    server_starts: int
    full_table_server_starts: int


class SweepSummary(Workload):
    """No speculation and each k of one draft, the schedule, and what was recommended."""

    schema_version: int
    kind: Literal["sweep"]
    results: list[SweepRow]
    recommended_k: dict[str, int]
    best_single_k: int
    schedule: SweepSchedule
    recommendation: SweepRecommendation
    serve_command: str
    environment: EnvironmentRecord | None
    prediction: NotRequired[PredictionRecord]  # tune --predict: predicted beside measured


class ComparisonSummary(Workload):
    schema_version: int
    kind: Literal["comparison"]
    baseline: str
    num_prompts: int | None
    devices: int
    device_unit: str
    servers: str
    server_starts: list[ServerStart]
    rounds: list[Round]
    points: list[Point]
    verdicts: list[Verdict]
    recommendation: Recommendation
    serve_lines: list[ServeLine]
    environment: EnvironmentRecord
    prediction: NotRequired[ComparisonPrediction]  # tune --predict --baseline


def check_summary(summary: Mapping[str, Any], where: str = "tune results.json") -> str:
    """The summary's kind; an InputError naming the file when it is not one this version reads."""
    version = summary.get("schema_version")
    kind = summary.get("kind")
    if version != SCHEMA_VERSION or kind not in (SWEEP, COMPARISON):
        found = "no schema_version" if version is None else f"schema_version {version!r}"
        raise InputError(
            f"{where}: {found}, kind {kind!r}; this eaglequant reads schema_version "
            f"{SCHEMA_VERSION} ({SWEEP} or {COMPARISON}); re-run eaglequant tune"
        )
    return str(kind)


def as_comparison(summary: Mapping[str, Any]) -> ComparisonSummary:
    return cast(ComparisonSummary, summary)


def as_sweep(summary: Mapping[str, Any]) -> SweepSummary:
    return cast(SweepSummary, summary)


TuneSummary = SweepSummary | ComparisonSummary


def tune_summary(summary: Mapping[str, Any]) -> TuneSummary:
    """``summary`` typed once :func:`check_summary` has accepted it (an InputError otherwise)."""
    check_summary(summary)
    return cast(TuneSummary, summary)
