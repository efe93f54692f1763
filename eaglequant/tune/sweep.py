"""``eaglequant tune``: sweep ``num_speculative_tokens`` across concurrency on ``vllm serve``.

The article's procedure, automated: for no speculation and each k, start
``vllm serve`` (``engine.server``) with the user's serve arguments passed
through, drive it with vLLM's own ``vllm bench serve`` at each concurrency
``repeats`` times (``--save-result``), then stop it — always, on failure and
Ctrl-C too. From the per-concurrency winners
(``choice``) it builds one per-batch-size schedule, serves and measures
that too where it differs from a single k, and recommends what was measured to
be faster: the schedule, one k, or no speculation. Results: JSON, Markdown, PNG
plots and the exact serve line.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from statistics import fmean

from eaglequant.engine.config import probe_vllm
from eaglequant.engine.server import Server, serving
from eaglequant.environment import EnvironmentRecord, environment
from eaglequant.progress import Progress, quiet
from eaglequant.render.reports import mean_positions
from eaglequant.speculative import SpeculativeDict, schedule_config, speculative_config
from eaglequant.tune.bench import BenchClient, BenchResult, bench_command
from eaglequant.tune.choice import (
    Runs,
    Schedule,
    best_single,
    schedule_from_winners,
    schedule_misses,
    winner,
)
from eaglequant.tune.predict import Point, Prediction, confirmation_plan, predict
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
from eaglequant.tune.summary import (
    SCHEMA_VERSION,
    SWEEP,
    PredictedPoint,
    PredictionRecord,
    SweepRecommendation,
    SweepRow,
    SweepSummary,
)


@dataclass
class TuneResult:
    """One (server, concurrency) point averaged over its repeats; k 0 is no speculation.

    ``runs`` holds each repeat's output tokens/s. For the schedule's server k is
    its largest k and ``schedule`` is true.
    """

    k: int
    concurrency: int
    runs: list[float]
    mean_tpot_ms: float | None
    acceptance_length: float | None
    per_position: list[float] = field(default_factory=list)
    schedule: bool = False

    @property
    def output_throughput(self) -> float:
        return fmean(self.runs)


def to_result(k: int, concurrency: int, raws: list[BenchResult], schedule: bool) -> TuneResult:
    """One point from its repeats' ``--save-result`` files (latency and acceptance averaged)."""
    positions = [r.get("spec_decode_per_position_acceptance_rates") for r in raws]
    return TuneResult(
        k=k,
        concurrency=concurrency,
        runs=[float(r["output_throughput"]) for r in raws],
        mean_tpot_ms=_mean([r.get("mean_tpot_ms") for r in raws]),
        acceptance_length=_mean([r.get("spec_decode_acceptance_length") for r in raws]),
        per_position=mean_positions([p for p in positions if p]) if any(positions) else [],
        schedule=schedule,
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
    concurrencies: Sequence[int] | None = None,
) -> list[TuneResult]:
    """Serve one configuration and bench it ``repeats`` times at every concurrency (or at
    ``concurrencies``)."""
    server = Server(
        model=str(request.target),
        flags=engine_flags(request, config.spec, max_len),
        log=request.out / f"serve-{config.label}.log",
        env=env,
    )
    progress(f"vllm serve {config.label} on port {server.port} ...")
    results = []
    with serving(server, request.server_timeout_s):
        for concurrency in concurrencies or request.concurrencies:
            raws = []
            for repeat in range(request.repeats):
                result = scratch / f"{config.label}-c{concurrency}-r{repeat}.json"
                warmups = concurrency if repeat == 0 else 0
                cmd = bench_command(request, server.port, concurrency, result, warmups=warmups)
                raws.append(
                    bench.run(cmd, result, request.out / "bench.log", request.bench_timeout_s)
                )
            results.append(to_result(config.k, concurrency, raws, config.schedule))
            runs = ", ".join(f"{t:.1f}" for t in results[-1].runs)
            progress(f"{config.label} concurrency {concurrency}: {runs} tok/s")
    return results


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
    with (
        tempfile.TemporaryDirectory(prefix="eaglequant-tune-") as scratch,
        BenchClient(Path(scratch) / "bench-client.log") as bench,
    ):
        run = partial(
            measure, request, env=env, max_len=max_len, scratch=Path(scratch), progress=progress
        )
        if request.predict:
            results, prediction = predicted_sweep(request, configs, partial(run, bench=bench))
        else:
            for config in configs:
                results += run(config, bench=bench)
        ranges, skipped = planned_schedule(request, sweep_runs(results))
        if skipped is None:
            spec = schedule_config(draft, ranges, request.draft_kv_cache_dtype)
            config = Configuration(
                label="schedule", k=spec["num_speculative_tokens"], spec=spec, schedule=True
            )
            results += run(config, bench=bench)
        else:
            progress(f"no schedule run: {skipped}")
    on_cpu = probe_vllm(sys.executable).on_cpu
    summary = summarize(request, results, max_len, environment(environ=env, gpus=not on_cpu))
    if request.predict:
        summary["prediction"] = prediction_block(prediction, results, request)
    write_reports(request.out, summary)
    return summary


def predicted_sweep(
    request: TuneRequest, configs: list[Configuration], run: Callable[..., list[TuneResult]]
) -> tuple[list[TuneResult], list[Prediction]]:
    """No speculation and the largest k at every concurrency; every other (k, concurrency)
    predicted from them; then served only where the recommendation rests on it."""
    largest = max(request.ks)
    results = [r for c in configs if c.k in (0, largest) for r in run(c)]
    points = [Point(r.k, r.concurrency, tuple(r.runs), tuple(r.per_position)) for r in results]
    prediction = predict(points, request.ks)
    plan = confirmation_plan(prediction, {(r.k, r.concurrency) for r in results})
    for config in configs:
        at = sorted(c for k, c in plan if k == config.k)
        if at:
            results += run(config, concurrencies=at)
    return results, prediction


def prediction_block(
    prediction: list[Prediction], results: list[TuneResult], request: TuneRequest
) -> PredictionRecord:
    """results.json's ``prediction``: each (k, concurrency) predicted, with what was measured
    there (None: only predicted), and the server starts spent against the full sweep's."""
    measured = {(r.k, r.concurrency): r.output_throughput for r in results if not r.schedule}
    fitted = {0, max(request.ks)}
    rows: list[PredictedPoint] = [
        {
            "k": p.k,
            "concurrency": p.concurrency,
            "point": p.point,
            "low": p.low,
            "high": p.high,
            "extrapolated": p.extrapolated,
            "measured": measured.get((p.k, p.concurrency)),
            "fitted": p.k in fitted,
        }
        for p in prediction
    ]
    errors = sorted(
        abs(r["point"] / found - 1)
        for r in rows
        if (found := r["measured"]) is not None and not r["fitted"]
    )
    return {
        "fitted_on": sorted(fitted),
        "points": rows,
        "median_abs_error": errors[len(errors) // 2] if errors else None,
        "server_starts": len({r.k for r in results if not r.schedule}),
        "full_sweep_server_starts": 1 + len(request.ks),
    }


def sweep_runs(results: list[TuneResult]) -> dict[int, dict[int, Runs]]:
    """concurrency -> k -> repeats, for the single-k servers (k 0: no speculation)."""
    sweep: dict[int, dict[int, Runs]] = {}
    for r in results:
        if not r.schedule:
            sweep.setdefault(r.concurrency, {})[r.k] = r.runs
    return sweep


def planned_schedule(
    request: TuneRequest, sweep: dict[int, dict[int, Runs]]
) -> tuple[Schedule, str | None]:
    """The schedule to measure (given, else the winners'); why it is not served (None: it is)."""
    if request.schedule is not None:
        ranges = list(request.schedule)
    else:
        ranges = schedule_from_winners({c: winner(runs) for c, runs in sweep.items()})
        if len(ranges) == 1:
            return ranges, f"{uniform(ranges[0][2])}, so the schedule is that single choice"
    if int(request.engine.engine_args.get("data_parallel_size") or 1) > 1:
        return ranges, "vLLM turns per-batch-size schedules off under data parallelism"
    return ranges, None


def summarize(
    request: TuneRequest,
    results: list[TuneResult],
    max_len: int,
    env: EnvironmentRecord | None = None,
) -> SweepSummary:
    """results.json's content (``env``: the run's ``environment()`` block)."""
    sweep = sweep_runs(results)
    ranges, skipped = planned_schedule(request, sweep)
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
        "results": [_row(r, sweep) for r in results if not r.schedule],
        "recommended_k": {str(c): winner(runs) for c, runs in sweep.items()},
        "best_single_k": best_single(sweep, request.ks),
        "schedule": {
            "ranges": [list(r) for r in ranges],
            "given": request.schedule is not None,
            "measured": bool(scheduled),
            "not_measured_because": skipped,
            "results": [_row(r, sweep) for r in scheduled],
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
    """One winner everywhere; else the schedule where it held; else the best single k (0: none)."""
    winners = {c: winner(runs) for c, runs in sweep.items()}
    misses = (
        schedule_misses(
            {r.concurrency: r.runs for r in scheduled},
            {c: sweep[c][k] for c, k in winners.items()},
        )
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
        return {
            "choice": "schedule",
            "k": max(k for _, _, k in ranges),
            "schedule": True,
            "reason": "the schedule held: no per-concurrency winner beat it anywhere",
        }
    if skipped is None:
        skipped = behind
    k = best_single(sweep, (0, *request.ks))
    reason = f"{skipped}; {_name(k)} is the best single choice across the concurrencies"
    return {"choice": "single" if k else "none", "k": k, "schedule": False, "reason": reason}


def uniform(k: int) -> str:
    """Why one choice wins everywhere, as a clause."""
    if k == 0:
        return "no k beat no speculation beyond the run-to-run spread anywhere"
    return f"k={k} won at every concurrency"


def _name(k: int) -> str:
    return f"k={k}" if k else "no speculation"


def _row(r: TuneResult, sweep: dict[int, dict[int, Runs]]) -> SweepRow:
    baseline = fmean(sweep[r.concurrency][0])
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
    }
