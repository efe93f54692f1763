"""``eaglequant tune --baseline``: the draft against a baseline draft and no speculation.

The release table, measured controlled: at every k and concurrency, no
speculation, the baseline draft and the draft are served by one vLLM build with
one set of serve arguments (only ``--speculative-config`` differs), warmed up
alike and driven by the same ``vllm bench serve`` workload. Each configuration is
measured once per round; the rounds rotate the serving order (``compare.rounds``)
and the order is recorded. Servers are either restarted for every configuration
in every round (the default: each repeat is a fresh server, and only one server
holds the devices at a time) or started once and kept alive together (faster,
where memory allows all of them at once).

Acceptance comes from the server's own ``/metrics`` counters, read after the
warm-up and around each measurement, and must equal what the bench's result
file recorded; a difference fails the run.

With ``predict`` the table is predicted (``predict``): no speculation and each
draft at the largest k are served once, their rounds inside the server; every
other k is predicted for both drafts, and both are served once more at the k
predicted best for the draft (and at any k whose prediction was too noisy to
decide on): 5 server starts at most for any grid.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean, median

from eaglequant.engine.config import probe_vllm
from eaglequant.engine.server import Server
from eaglequant.progress import Progress
from eaglequant.results.environment import EnvironmentRecord, environment
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.results.tune_summary import (
    BASELINE,
    COMPARISON,
    DRAFT,
    NO_SPECULATION,
    SCHEMA_VERSION,
    Acceptance,
    ComparisonPrediction,
    ComparisonSummary,
    Point,
    RolePrediction,
    Round,
    ServerStart,
    Verdict,
)
from eaglequant.rules.speculative import SpeculativeDict, speculative_config
from eaglequant.tune.baseline_verdicts import (
    best_by_concurrency,
    choose,
    duel,
    recommendation,
    rounds,
    verdict_text,
)
from eaglequant.tune.bench import BenchClient, BenchResult, counted_run, warm_up
from eaglequant.tune.predict import Point as PredictPoint
from eaglequant.tune.predict import (
    acceptance_by_position,
    median_error,
    plan,
    predict,
    predicted_point,
)
from eaglequant.tune.report import write_comparison
from eaglequant.tune.request import (
    KEEP,
    ONCE,
    TuneRequest,
    check_request,
    devices,
    engine_flags,
    serve_env,
    serve_line,
    with_draft_kv_cache,
    workload,
)

DRAFTS = (BASELINE, DRAFT)


@dataclass(frozen=True)
class Candidate:
    """One served configuration: no speculation (k 0), or a draft proposing k tokens."""

    role: str
    k: int
    spec: SpeculativeDict | None

    @property
    def label(self) -> str:
        return NO_SPECULATION if self.spec is None else f"{self.role} k={self.k}"

    @property
    def slug(self) -> str:
        return self.label.replace(" ", "-").replace("=", "")


@dataclass(frozen=True)
class Sample:
    """One measurement: the bench's result file and the /metrics delta around it."""

    raw: BenchResult
    counters: SpecDecodeCounts | None


Samples = dict[tuple[str, int], list[Sample]]


def candidates(request: TuneRequest) -> list[Candidate]:
    """No speculation, then per k the baseline draft and the draft (its KV cache in the
    request's draft KV dtype; the baseline's as the target's)."""
    assert request.baseline is not None

    def kv(role: str) -> str | None:
        return request.draft_kv_cache_dtype if role == DRAFT else None

    found = [Candidate(NO_SPECULATION, 0, None)]
    for k in request.ks:
        for role, path in ((BASELINE, request.baseline), (DRAFT, request.draft)):
            found.append(Candidate(role, k, speculative_config(str(path), k, kv(role))))
    return found


@dataclass
class Run:
    """One comparison in progress: its servers' settings, samples and server start times."""

    request: TuneRequest
    max_len: int
    env: dict[str, str]
    scratch: Path
    bench: BenchClient
    progress: Progress = lambda _m: None
    samples: Samples = field(default_factory=dict)
    starts: list[ServerStart] = field(default_factory=list)

    @contextlib.contextmanager
    def served(self, candidate: Candidate, round_: int | None) -> Iterator[Server]:
        """The candidate's server, started, warmed up and healthy; stopped afterwards."""
        name = candidate.slug + ("" if round_ is None else f"-r{round_}")
        server = Server(
            model=str(self.request.target),
            flags=engine_flags(self.request, candidate.spec, self.max_len),
            log=self.request.out / f"serve-{name}.log",
            env=self.env,
        )
        self.progress(f"vllm serve {candidate.label} on port {server.port} ...")
        start_s = server.start(self.request.server_timeout_s)
        try:
            self.starts.append({"label": candidate.label, "round": round_, "start_s": start_s})
            warm_up(self.request, server.url, self.request.bench_timeout_s)
            yield server
        finally:
            server.stop()

    def measure(self, server: Server, candidate: Candidate, concurrency: int, round_: int) -> None:
        """One bench run; the /metrics delta around it must agree with the bench's file."""
        result = self.scratch / f"{candidate.slug}-c{concurrency}-r{round_}.json"
        what = f"{candidate.label} at concurrency {concurrency}, round {round_}"
        raw, delta = counted_run(self.bench, server, self.request, concurrency, result, what)
        self.samples.setdefault((candidate.label, concurrency), []).append(Sample(raw, delta))
        self.progress(
            f"round {round_} {candidate.label} concurrency {concurrency}: "
            f"{raw['output_throughput']:.1f} tok/s"
        )


def compare(request: TuneRequest, progress: Progress = lambda _m: None) -> ComparisonSummary:
    """Measure the three configurations in rotated rounds; write results.json/.md and plots."""
    request = with_draft_kv_cache(request)
    max_len = check_request(request)
    env = serve_env(request)
    count, unit = devices(request)
    configs = candidates(request)
    plan = rounds(configs, request.repeats)
    request.out.mkdir(parents=True, exist_ok=True)
    forecast = None
    with (
        tempfile.TemporaryDirectory(prefix="eaglequant-tune-") as scratch,
        BenchClient(Path(scratch) / "bench-client.log") as bench,
    ):
        run = Run(request, max_len, env, Path(scratch), bench, progress)
        if request.predict:
            configs, forecast = _measure_predicted(run)
            plan = [configs] * request.repeats
            run.request = request = replace(request, ks=tuple(forecast["measured_ks"]))
        elif request.servers == KEEP:
            _measure_kept(run, configs, plan)
        else:
            _measure_restarted(run, plan)
    block = environment(environ=env, gpus=not probe_vllm(sys.executable).on_cpu)
    summary = summarize(run, configs, plan, (count, unit), block)
    if forecast is not None:
        summary["servers"] = ONCE
        summary["prediction"] = forecast
    write_comparison(request.out, summary)
    return summary


def _measure_once(run: Run, candidate: Candidate) -> None:
    """One server for the candidate, its rounds over every concurrency inside it."""
    with run.served(candidate, None) as server:
        for r in range(run.request.repeats):
            for concurrency in run.request.concurrencies:
                run.measure(server, candidate, concurrency, r)


def _measure_predicted(run: Run) -> tuple[list[Candidate], ComparisonPrediction]:
    """No speculation and both drafts at the largest k; every k predicted for both; both
    drafts served again at the draft's predicted best k and at any k too noisy to decide."""
    request = run.request
    by_k = {(c.role, c.k): c for c in candidates(request)}
    largest = max(request.ks)
    served = [by_k[NO_SPECULATION, 0], by_k[BASELINE, largest], by_k[DRAFT, largest]]
    for candidate in served:
        _measure_once(run, candidate)
    predictions = {role: predict(_fit_points(run, role, largest), request.ks) for role in DRAFTS}
    chosen = plan(predictions[DRAFT], request.ks, schedules=False)
    recommended = chosen.single or largest
    noisy = sorted({k for k, _ in chosen.noisy} - {0, largest, recommended})
    for k in noisy:
        run.progress(f"draft k={k}: its prediction is too wide to decide on; measuring it")
    for k in sorted({recommended, *noisy} - {largest}):
        for role in DRAFTS:
            served.append(by_k[role, k])
            _measure_once(run, by_k[role, k])
    measured_ks = sorted({c.k for c in served if c.k})
    roles: list[RolePrediction] = []
    for role in DRAFTS:
        rows = []
        for p in predictions[role]:
            label = NO_SPECULATION if p.k == 0 else f"{role} k={p.k}"
            runs = _runs(run.samples, label, p.concurrency) if p.k in (0, *measured_ks) else None
            rows.append(predicted_point(p, runs, p.k in (0, largest)))
        roles.append({"role": role, "points": rows})
    record: ComparisonPrediction = {
        "fitted_on": [0, largest],
        "ks": sorted(request.ks),
        "roles": roles,
        "recommended_k": chosen.single,
        "measured_ks": measured_ks,
        "noisy_measured": noisy,
        "median_abs_error": median_error(p for r in roles for p in r["points"]),
        "server_starts": len(run.starts),
        "full_table_server_starts": 1 + 2 * len(request.ks),
    }
    return served, record


def _fit_points(run: Run, role: str, k: int) -> list[PredictPoint]:
    """No speculation's and one draft's measured points at k, acceptance from /metrics."""
    points = []
    for concurrency in run.request.concurrencies:
        none = _runs(run.samples, NO_SPECULATION, concurrency)
        points.append(PredictPoint(0, concurrency, tuple(none)))
        taken = run.samples[f"{role} k={k}", concurrency]
        counts = SpecDecodeCounts.total(s.counters for s in taken if s.counters is not None)
        runs = tuple(float(s.raw["output_throughput"]) for s in taken)
        points.append(PredictPoint(k, concurrency, runs, acceptance_by_position(counts)))
    return points


def _measure_restarted(run: Run, plan: list[list[Candidate]]) -> None:
    for r, order in enumerate(plan):
        for candidate in order:
            with run.served(candidate, r) as server:
                for concurrency in run.request.concurrencies:
                    run.measure(server, candidate, concurrency, r)


def _measure_kept(run: Run, configs: list[Candidate], plan: list[list[Candidate]]) -> None:
    with contextlib.ExitStack() as stack:
        servers = {c.label: stack.enter_context(run.served(c, None)) for c in configs}
        for r, order in enumerate(plan):
            for concurrency in run.request.concurrencies:
                for candidate in order:
                    run.measure(servers[candidate.label], candidate, concurrency, r)


def summarize(
    run: Run,
    configs: list[Candidate],
    plan: list[list[Candidate]],
    devices: tuple[int, str],
    env: EnvironmentRecord,
) -> ComparisonSummary:
    """results.json's content from the samples (``devices``: count and unit; ``env``: the
    run's ``environment()`` block)."""
    request = run.request
    assert request.baseline is not None
    count, unit = devices
    points = [
        to_point(c, level, run.samples, count) for level in request.concurrencies for c in configs
    ]
    verdicts = [
        to_verdict(k, level, run.samples) for k in request.ks for level in request.concurrencies
    ]
    best = best_by_concurrency(
        {
            level: {v["k"]: v["choice"] for v in verdicts if v["concurrency"] == level}
            for level in request.concurrencies
        },
        {(p["role"], p["k"], p["concurrency"]): p["runs"] for p in points},
    )
    return {
        **workload(request, run.max_len),
        "schema_version": SCHEMA_VERSION,
        "kind": COMPARISON,
        "baseline": str(request.baseline),
        "num_prompts": request.num_prompts,
        "devices": count,
        "device_unit": unit,
        "servers": request.servers,
        "server_starts": run.starts,
        "rounds": [Round(round=r, order=[c.label for c in order]) for r, order in enumerate(plan)],
        "points": points,
        "verdicts": verdicts,
        "recommendation": {
            "text": recommendation(best),
            "by_concurrency": {str(c): name for c, name in best.items()},
            "k": draft_k(best),
            "schedule": False,
        },
        "serve_lines": [
            {"label": c.label, "line": serve_line(request, c.spec, run.max_len)} for c in configs
        ],
        "environment": env,
    }


def draft_k(best: dict[int, str]) -> int:
    """The draft's k chosen most often across concurrencies (the smaller on a tie); 0: none."""
    ks = [int(name.rsplit("=", 1)[1]) for name in best.values() if name.startswith(DRAFT)]
    return min(set(ks), key=lambda k: (-ks.count(k), k)) if ks else 0


def _runs(samples: Samples, label: str, concurrency: int) -> list[float]:
    return [float(s.raw["output_throughput"]) for s in samples[label, concurrency]]


def to_point(candidate: Candidate, concurrency: int, samples: Samples, devices: int) -> Point:
    """One configuration's repeats at one concurrency, against no speculation's mean there."""
    runs = _runs(samples, candidate.label, concurrency)
    none = fmean(_runs(samples, NO_SPECULATION, concurrency))
    mean = fmean(runs)
    taken = samples[candidate.label, concurrency]
    return {
        "role": candidate.role,
        "k": candidate.k,
        "concurrency": concurrency,
        "runs": runs,
        "output_throughput": mean,
        "throughput_min": min(runs),
        "throughput_max": max(runs),
        "per_device": mean / devices,
        "speedup": mean / none,
        "speedup_min": min(runs) / none,
        "speedup_max": max(runs) / none,
        "median_tpot_ms": _median([s.raw.get("median_tpot_ms") for s in taken]),
        "median_ttft_ms": _median([s.raw.get("median_ttft_ms") for s in taken]),
        "acceptance": to_acceptance(taken) if candidate.spec is not None else None,
    }


def to_acceptance(taken: list[Sample]) -> Acceptance | None:
    """Acceptance pooled over the repeats' /metrics deltas (drafts summed, then divided)."""
    deltas = [s.counters for s in taken if s.counters is not None]
    if not deltas:
        return None
    pooled = SpecDecodeCounts.total(deltas)
    return {
        "drafts": pooled.drafts,
        "draft_tokens": pooled.draft_tokens,
        "accepted_tokens": pooled.accepted_tokens,
        "accepted_per_position": list(pooled.accepted_per_position),
        "mean_length": pooled.mean_acceptance_length,
        "per_position": pooled.per_position_rates,
        "lengths": [s.counters.mean_acceptance_length if s.counters else None for s in taken],
        "bench_lengths": [s.raw.get("spec_decode_acceptance_length") for s in taken],
    }


def to_verdict(k: int, concurrency: int, samples: Samples) -> Verdict:
    none = _runs(samples, NO_SPECULATION, concurrency)
    baseline = _runs(samples, f"{BASELINE} k={k}", concurrency)
    draft = _runs(samples, f"{DRAFT} k={k}", concurrency)
    vs_baseline = duel(draft, baseline, DRAFT, BASELINE)
    draft_vs_none = duel(draft, none, DRAFT, NO_SPECULATION)
    baseline_vs_none = duel(baseline, none, BASELINE, NO_SPECULATION)
    return {
        "k": k,
        "concurrency": concurrency,
        "draft_vs_baseline": vs_baseline,
        "draft_vs_none": draft_vs_none,
        "baseline_vs_none": baseline_vs_none,
        "choice": choose(none, baseline, draft),
        "text": verdict_text(vs_baseline, draft_vs_none, baseline_vs_none),
    }


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None
