"""``eaglequant tune``: sweep ``num_speculative_tokens`` across concurrency on ``vllm serve``.

The article's procedure, automated: for no speculation and each k, start
``vllm serve`` (``engine.server``) with the user's serve arguments passed
through, warm it up, drive it with vLLM's own ``vllm bench serve`` in ``repeats``
rounds over the concurrencies inside that one server (``--save-result``, the
server's /metrics counters around each run), then stop it — always, on failure
and Ctrl-C too. From the per-concurrency winners
(``choice``) it builds one per-batch-size schedule, serves and measures
that too where it differs from a single k, and recommends what was measured to
be faster: the schedule, one k, or no speculation. Results: JSON, Markdown, PNG
plots and the exact serve line.

``--predict`` serves no speculation and the largest k only, predicts every other
point (``predict``), and serves one confirmation: the predicted recommendation
(one k, or the schedule), plus any point the recommendation rests on whose
prediction was too noisy to decide on.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from statistics import fmean

from eaglequant.engine.config import probe_vllm
from eaglequant.engine.server import Server, serving
from eaglequant.progress import Progress, quiet
from eaglequant.results.environment import EnvironmentRecord, environment
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.results.tune_summary import (
    SCHEMA_VERSION,
    SWEEP,
    AcceptanceCheck,
    PredictedSchedule,
    PredictionRecord,
    SweepRecommendation,
    SweepRow,
    SweepSummary,
)
from eaglequant.rules.speculative import SpeculativeDict, schedule_config, speculative_config
from eaglequant.tune.bench import (
    BenchClient,
    BenchResult,
    acceptance_workload,
    counted_run,
    warm_up,
)
from eaglequant.tune.choice import (
    Runs,
    Schedule,
    best_single,
    k_runs,
    schedule_from_winners,
    schedule_misses,
    standing,
    winner,
)
from eaglequant.tune.predict import (
    Plan,
    Point,
    Prediction,
    acceptance_by_position,
    median_error,
    plan,
    predict,
    predict_schedule,
    predicted_length,
    predicted_point,
)
from eaglequant.tune.report import write_reports
from eaglequant.tune.request import (
    TuneRequest,
    check_request,
    engine_flags,
    serve_env,
    serve_line,
    with_draft_kv_cache,
    workload,
)


@dataclass
class TuneResult:
    """One (server, concurrency) point over its rounds; k 0 is no speculation.

    ``runs`` holds each round's output tokens/s; ``counts`` the server's spec-decode counters
    pooled over the rounds (None: no speculation). For the schedule's server k is its largest
    k and ``schedule`` is true.
    """

    k: int
    concurrency: int
    runs: list[float]
    mean_tpot_ms: float | None
    acceptance_length: float | None
    per_position: list[float] = field(default_factory=list)
    schedule: bool = False
    counts: SpecDecodeCounts | None = None

    @property
    def output_throughput(self) -> float:
        return fmean(self.runs)


Sample = tuple[BenchResult, SpecDecodeCounts | None]


def to_result(k: int, concurrency: int, samples: list[Sample], schedule: bool) -> TuneResult:
    """One point from its rounds' ``--save-result`` files and /metrics deltas (latency
    averaged, acceptance pooled over the rounds' counters)."""
    deltas = [counts for _, counts in samples if counts is not None and counts.drafts]
    pooled = SpecDecodeCounts.total(deltas) if deltas else None
    return TuneResult(
        k=k,
        concurrency=concurrency,
        runs=[float(raw["output_throughput"]) for raw, _ in samples],
        mean_tpot_ms=_mean([raw.get("mean_tpot_ms") for raw, _ in samples]),
        acceptance_length=pooled.mean_acceptance_length if pooled else None,
        per_position=pooled.per_position_rates if pooled else [],
        schedule=schedule,
        counts=pooled,
    )


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return fmean(present) if present else None


@dataclass(frozen=True, kw_only=True)
class Configuration:
    """One ``vllm serve`` configuration of the sweep."""

    label: str
    k: int
    spec: SpeculativeDict | None
    schedule: bool = False


def measure(
    request: TuneRequest,
    config: Configuration,
    env: dict[str, str],
    max_len: int,
    scratch: Path,
    progress: Progress,
    bench: BenchClient,
) -> list[TuneResult]:
    """Serve one configuration, warm it up, and bench it in ``repeats`` rounds over every
    concurrency, all inside this one server."""
    server = Server(
        model=str(request.target),
        flags=engine_flags(request, config.spec, max_len),
        log=request.out / f"serve-{config.label}.log",
        env=env,
    )
    progress(f"vllm serve {config.label} on port {server.port} ...")
    samples: dict[int, list[Sample]] = {c: [] for c in request.concurrencies}
    with serving(server, request.server_timeout_s):
        warm_up(request, server.url, request.bench_timeout_s)
        for round_ in range(request.repeats):
            for concurrency in request.concurrencies:
                result = scratch / f"{config.label}-c{concurrency}-r{round_}.json"
                what = f"{config.label} at concurrency {concurrency}, round {round_}"
                sample = counted_run(bench, server, request, concurrency, result, what)
                samples[concurrency].append(sample)
                progress(f"{what}: {sample[0]['output_throughput']:.1f} tok/s")
    return [to_result(config.k, c, found, config.schedule) for c, found in samples.items()]


def tune(request: TuneRequest, progress: Progress = quiet) -> SweepSummary:
    """Run the sweep and write results.json, results.md and the plots into ``request.out``."""
    request = with_draft_kv_cache(request)
    max_len = check_request(request)
    env = serve_env(request)
    request.out.mkdir(parents=True, exist_ok=True)
    draft = str(request.draft)
    configs = [Configuration(label="no-speculation", k=0, spec=None)] + [
        Configuration(
            label=f"k{k}", k=k, spec=speculative_config(draft, k, request.draft_kv_cache_dtype)
        )
        for k in request.ks
    ]
    results: list[TuneResult] = []
    forecast: Forecast | None = None
    with (
        tempfile.TemporaryDirectory(prefix="eaglequant-tune-") as scratch,
        BenchClient(Path(scratch) / "bench-client.log") as bench,
    ):
        run = partial(
            measure,
            request,
            env=env,
            max_len=max_len,
            scratch=Path(scratch),
            progress=progress,
            bench=bench,
        )
        if request.predict:
            results, forecast = predicted_sweep(request, configs, run, progress)
        else:
            for config in configs:
                results += run(config)
            ranges, skipped = planned_schedule(request, sweep_runs(results))
            if skipped is None:
                results += run(schedule_configuration(request, ranges))
            else:
                progress(f"no schedule run: {skipped}")
    on_cpu = probe_vllm(sys.executable).on_cpu
    served = forecast.plan.schedule if forecast else None
    unserved = unserved_schedule(forecast.plan) if forecast and served is None else None
    summary = summarize(
        request, results, max_len, environment(environ=env, gpus=not on_cpu), served, unserved
    )
    if forecast is not None:
        summary["prediction"] = prediction_block(forecast, results, request)
    write_reports(request.out, summary)
    return summary


def schedule_configuration(request: TuneRequest, ranges: Schedule) -> Configuration:
    spec = schedule_config(str(request.draft), ranges, request.draft_kv_cache_dtype)
    return Configuration(
        label="schedule", k=spec["num_speculative_tokens"], spec=spec, schedule=True
    )


@dataclass(frozen=True)
class Forecast:
    """``tune --predict``'s record: the predictions, what they recommend, what was served to
    confirm it, and why (``noisy``: points measured because their prediction was too noisy)."""

    predictions: list[Prediction]
    plan: Plan
    confirmed: str | None
    noisy_measured: list[int]


def predicted_sweep(
    request: TuneRequest,
    configs: list[Configuration],
    run: Callable[[Configuration], list[TuneResult]],
    progress: Progress = quiet,
) -> tuple[list[TuneResult], Forecast]:
    """No speculation and the largest k at every concurrency; every other (k, concurrency)
    predicted from them; then one confirmation server of the predicted recommendation (the
    schedule, or one k not served yet), and a server for each k the recommendation rests on
    where its prediction was too noisy to decide on."""
    largest = max(request.ks)
    by_k = {c.k: c for c in configs}
    results = run(by_k[0]) + run(by_k[largest])
    points = [Point(r.k, r.concurrency, tuple(r.runs), _positions(r)) for r in results]
    predictions = predict(points, request.ks)
    chosen = plan(
        predictions,
        request.ks,
        schedules=not data_parallel(request),
        scheduled=partial(predict_schedule, points),
    )
    served = {0, largest}
    confirmed = None
    if chosen.schedule is not None:
        confirmed = "schedule"
        results += run(schedule_configuration(request, chosen.schedule))
    elif chosen.single not in served:
        confirmed = f"k={chosen.single}"
        results += run(by_k[chosen.single])
        served.add(chosen.single)
    noisy = sorted({k for k, _ in chosen.noisy} - served)
    for k in noisy:
        spread = max(p.spread for p in predictions if p.k == k)
        progress(
            f"k={k}: its prediction spans {spread:.0%} of its value, too wide to decide on; "
            "measuring it instead"
        )
        results += run(by_k[k])
    return results, Forecast(predictions, chosen, confirmed, noisy)


def _positions(result: TuneResult) -> tuple[float, ...]:
    return acceptance_by_position(result.counts) if result.counts is not None else ()


def data_parallel(request: TuneRequest) -> bool:
    """vLLM turns per-batch-size schedules off under data parallelism."""
    return int(request.engine.engine_args.get("data_parallel_size") or 1) > 1


def prediction_block(
    forecast: Forecast, results: list[TuneResult], request: TuneRequest
) -> PredictionRecord:
    """results.json's ``prediction``: each (k, concurrency) predicted with its interval, with
    what was measured there (None: only predicted), the predicted recommendation, what was
    served to confirm it, and the server starts spent against the full sweep's."""
    measured = {(r.k, r.concurrency): r.runs for r in results if not r.schedule}
    fitted = {0, max(request.ks)}
    rows = [
        predicted_point(p, measured.get((p.k, p.concurrency)), p.k in fitted)
        for p in forecast.predictions
    ]
    chosen = forecast.plan
    largest = {r.concurrency: r.per_position for r in results if r.k == max(request.ks)}
    checks: list[AcceptanceCheck] = [
        {
            "k": r.k,
            "concurrency": r.concurrency,
            "predicted_length": predicted_length(largest[r.concurrency], r.k),
            "measured_length": r.acceptance_length,
        }
        for r in results
        if not r.schedule and r.k not in fitted and r.acceptance_length is not None
    ]
    served_schedule = {r.concurrency: r.runs for r in results if r.schedule}
    schedule_record = predicted_schedule_record(chosen, served_schedule)
    schedule_errors = schedule_record.get("errors", {}) if schedule_record else {}
    return {
        "fitted_on": sorted(fitted),
        "points": rows,
        "winners": {str(c): k for c, k in chosen.winners.items()},
        "single": chosen.single,
        "schedule": None if chosen.schedule is None else [list(r) for r in chosen.schedule],
        "schedule_predicted": schedule_record,
        "confirmed": forecast.confirmed,
        "noisy_measured": forecast.noisy_measured,
        "acceptance_checks": checks,
        "median_abs_error": median_error(rows, schedule_errors.values()),
        "server_starts": len({(r.k, r.schedule) for r in results}),
        "full_sweep_server_starts": 1 + len(request.ks),
    }


def predicted_schedule_record(
    chosen: Plan, served: Mapping[int, Runs] | None = None
) -> PredictedSchedule | None:
    """The winners' schedule as predicted (None: the winners agreed, or schedules are off)
    and, where it was served (``served``: concurrency -> its measured rounds), what it
    measured there and the prediction's error against that."""
    if not chosen.scheduled:
        return None
    record: PredictedSchedule = {
        "ranges": [list(r) for r in schedule_from_winners(chosen.winners)],
        "runs": {str(c): list(runs) for c, runs in chosen.scheduled.items()},
        "behind": {str(c): k for c, k in chosen.behind.items()},
    }
    if served:
        record["measured"] = {
            str(c): [min(runs), fmean(runs), max(runs)] for c, runs in served.items()
        }
        record["errors"] = {
            str(c): chosen.scheduled[c][1] / fmean(runs) - 1
            for c, runs in served.items()
            if c in chosen.scheduled
        }
    return record


def sweep_runs(results: list[TuneResult]) -> dict[int, dict[int, Runs]]:
    """concurrency -> k -> repeats, for the single-k servers (k 0: no speculation)."""
    sweep: dict[int, dict[int, Runs]] = {}
    for r in results:
        if not r.schedule:
            sweep.setdefault(r.concurrency, {})[r.k] = r.runs
    return sweep


def unserved_schedule(chosen: Plan) -> str:
    """Why ``--predict`` served no schedule, as a clause."""
    if chosen.behind:
        behind = ", ".join(f"{_name(k)} at concurrency {c}" for c, k in chosen.behind.items())
        return f"the schedule was predicted to fall behind {behind}, so it was not served"
    return "the prediction found one choice for every concurrency, so no schedule was served"


def planned_schedule(
    request: TuneRequest,
    sweep: dict[int, dict[int, Runs]],
    served: Schedule | None = None,
    unserved: str | None = None,
) -> tuple[Schedule, str | None]:
    """The schedule to measure (``served``: the one ``--predict`` served; given; else the
    winners'); why it is not served (None: it is; ``unserved``: why ``--predict`` did not)."""
    if served is not None:
        return served, None
    if request.schedule is not None:
        ranges = list(request.schedule)
    else:
        ranges = schedule_from_winners({c: winner(runs) for c, runs in sweep.items()})
        if len(ranges) == 1:
            return ranges, f"{uniform(ranges[0][2])}, so the schedule is that single choice"
    if data_parallel(request):
        return ranges, "vLLM turns per-batch-size schedules off under data parallelism"
    return ranges, unserved


def summarize(
    request: TuneRequest,
    results: list[TuneResult],
    max_len: int,
    env: EnvironmentRecord | None = None,
    served: Schedule | None = None,
    unserved: str | None = None,
) -> SweepSummary:
    """results.json's content (``env``: the run's ``environment()`` block; ``served``: the
    schedule ``--predict`` served to confirm its recommendation, ``unserved``: why it served
    none)."""
    sweep = sweep_runs(results)
    ranges, skipped = planned_schedule(request, sweep, served, unserved)
    scheduled = [r for r in results if r.schedule]
    choice = recommend(request, sweep, ranges, skipped, scheduled)
    draft = str(request.draft)
    spec = None
    if choice["schedule"]:
        spec = schedule_config(draft, ranges, request.draft_kv_cache_dtype)
    elif choice["k"]:
        spec = speculative_config(draft, choice["k"], request.draft_kv_cache_dtype)
    ranged = any(k for _, _, k in ranges)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": SWEEP,
        **workload(request, max_len),
        "results": [_row(r, sweep, request) for r in results if not r.schedule],
        "recommended_k": {str(c): winner(runs) for c, runs in sweep.items()},
        "best_single_k": best_single(sweep, request.ks),
        "schedule": {
            "ranges": [list(r) for r in ranges],
            "given": request.schedule is not None,
            "measured": bool(scheduled),
            "not_measured_because": skipped,
            "results": [_row(r, sweep, request) for r in scheduled],
            "serve_command": serve_line(
                request, schedule_config(draft, ranges, request.draft_kv_cache_dtype), max_len
            )
            if ranged
            else None,
        },
        "recommendation": choice,
        "serve_command": serve_line(request, spec, max_len),
        "environment": env,
    }


def recommend(
    request: TuneRequest,
    sweep: dict[int, dict[int, Runs]],
    ranges: Schedule,
    skipped: str | None,
    scheduled: list[TuneResult],
) -> SweepRecommendation:
    """One winner everywhere; else the schedule where it held; else the best single k (0:
    none), or the measured schedule where it stands better than that k (``standing``)."""
    winners = {c: winner(runs) for c, runs in sweep.items()}
    schedule_runs = {r.concurrency: r.runs for r in scheduled}
    misses = (
        schedule_misses(schedule_runs, {c: sweep[c][k] for c, k in winners.items()})
        if scheduled
        else []
    )
    behind = "the schedule fell behind " + ", ".join(
        f"{_name(winners[c])} at concurrency {c}" for c in misses
    )
    if len(set(winners.values())) == 1:
        k = next(iter(winners.values()))
        reason = uniform(k) + (f"; {behind}" if misses else "")
        return {"choice": "single" if k else "none", "k": k, "schedule": False, "reason": reason}
    if skipped is None and not misses:
        return _schedule_choice(
            ranges, "the schedule held: no per-concurrency winner beat it anywhere"
        )
    if skipped is None:
        skipped = behind
    k = best_single(sweep, (0, *request.ks))
    if scheduled:
        served = standing(sweep, schedule_runs)
        single = standing(sweep, k_runs(sweep, k))
        if served > single:
            return _schedule_choice(
                ranges,
                f"{behind}, yet it ties or beats the winners at {served[0]} concurrencies and "
                f"runs at {served[1]:.2f}x no speculation (geometric mean), where the best single "
                f"choice, {_name(k)}, does at {single[0]} and {single[1]:.2f}x",
            )
    reason = f"{skipped}; {_name(k)} is the best single choice across the concurrencies"
    return {"choice": "single" if k else "none", "k": k, "schedule": False, "reason": reason}


def _schedule_choice(ranges: Schedule, reason: str) -> SweepRecommendation:
    """The recommendation to serve ``ranges`` (its k: the largest of them)."""
    return {
        "choice": "schedule",
        "k": max(k for _, _, k in ranges),
        "schedule": True,
        "reason": reason,
    }


def uniform(k: int) -> str:
    """Why one choice wins everywhere, as a clause."""
    if k == 0:
        return "no k beat no speculation beyond the run-to-run spread anywhere"
    return f"k={k} won at every concurrency"


def _name(k: int) -> str:
    return f"k={k}" if k else "no speculation"


def _row(r: TuneResult, sweep: dict[int, dict[int, Runs]], request: TuneRequest) -> SweepRow:
    baseline = fmean(sweep[r.concurrency][0])
    single = r.k and not r.schedule
    return {
        "k": r.k,
        "concurrency": r.concurrency,
        "runs": list(r.runs),
        "mean_tpot_ms": r.mean_tpot_ms,
        "acceptance_length": r.acceptance_length,
        "per_position": list(r.per_position),
        "schedule": r.schedule,
        "output_throughput": r.output_throughput,
        "throughput_min": min(r.runs),
        "throughput_max": max(r.runs),
        "speedup": r.output_throughput / baseline if baseline else None,
        "workload": (
            acceptance_workload(request, r.k, r.concurrency).to_json() if single else None
        ),
    }
