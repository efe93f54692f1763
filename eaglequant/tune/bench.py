"""``vllm bench serve`` against one running server: its command line, its run, its result.

vLLM's own benchmark client (``vllm.benchmarks.serve``, this interpreter) runs with
``--save-result``; the result file is what tune records. One child (:class:`BenchClient`)
imports it once and runs every measurement of a tune run in turn, each from its own
``vllm bench serve`` argument list: the import costs 10-20 s, and a sweep runs dozens. The
workload (random tokens of ISL/OSL, or a prompts file) and the seed are the same for every
configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypedDict, cast

from eaglequant.engine.process import LOG_TAIL_CHARS, kill_group
from eaglequant.engine.server import HOST, Server
from eaglequant.engine.vllm_internals import BENCH_MODULE, BENCH_PARSER
from eaglequant.errors import CheckFailed
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.results.workload import AcceptanceWorkload
from eaglequant.tune.metrics import bench_problem, parse_counters
from eaglequant.tune.request import TuneRequest, dataset_name

if TYPE_CHECKING:  # Python 3.11's; annotations stay strings at run time (3.10 too)
    from typing import Required


class BenchResult(TypedDict, total=False):
    """What tune reads of a ``vllm bench serve --save-result`` file (vLLM writes more): the
    throughput, latencies, and the acceptance it counted where the server speculated."""

    output_throughput: Required[float]
    mean_tpot_ms: float
    median_tpot_ms: float
    median_ttft_ms: float
    spec_decode_acceptance_length: float
    spec_decode_per_position_acceptance_rates: list[float]
    spec_decode_num_drafts: int
    spec_decode_draft_tokens: int
    spec_decode_accepted_tokens: int


BENCH_IMPORTS = (
    f"from {BENCH_MODULE} import add_cli_args, main\n"
    f"from {BENCH_PARSER} import FlexibleArgumentParser\n"
)
BENCH_SCRIPT = (
    "import sys\n" + BENCH_IMPORTS + "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
# The client child: one ``vllm bench serve`` run per line of JSON on stdin ([argv, done
# file]); "ok" or the traceback goes to the done file (whole, by a rename) once the run ended.
BENCH_LOOP = (
    "import json, os, sys, traceback\n"
    "from pathlib import Path\n" + BENCH_IMPORTS + "for line in sys.stdin:\n"
    "    argv, done = json.loads(line)\n"
    "    try:\n"
    "        parser = FlexibleArgumentParser()\n"
    "        add_cli_args(parser)\n"
    "        main(parser.parse_args(argv))\n"
    "        status = 'ok'\n"
    "    except BaseException:\n"
    "        status = traceback.format_exc()\n"
    "    sys.stdout.flush(); sys.stderr.flush()\n"
    "    Path(done + '.part').write_text(status)\n"
    "    os.replace(done + '.part', done)\n"
)
POLL_S = 0.1
SEED = 0
# Warm-up prompts are token ids cycling through 1..WARMUP_IDS (inside any real vocabulary):
# exactly ISL tokens, and no prefix that a measured prompt could find cached.
WARMUP_IDS = 1000


def num_prompts(request: TuneRequest, concurrency: int) -> int:
    return request.num_prompts or max(2 * concurrency, 8)


def acceptance_workload(request: TuneRequest, k: int, concurrency: int) -> AcceptanceWorkload:
    """What one measurement's acceptance is measured on: the bench's prompts (each repeat),
    chat-templated where asked (custom prompts only), OSL tokens (the random dataset, or where
    asked, ignoring EOS), greedy."""
    name = dataset_name(request)
    source = request.prompts_source or (str(request.prompts) if request.prompts else None)
    return AcceptanceWorkload(
        prompt_set=source or f"random {request.isl}-token prompts",
        prompts=num_prompts(request, concurrency),
        chat_template=name == "custom" and request.chat_template,
        k=k,
        max_tokens=request.osl,
        ignore_eos=name == "random" or request.ignore_eos,
        concurrency=concurrency,
    )


def bench_command(
    request: TuneRequest,
    port: int,
    concurrency: int,
    result_file: Path,
) -> list[str]:
    """The ``vllm bench serve`` command line for one measurement at ``concurrency``."""
    cmd = [sys.executable, "-c", BENCH_SCRIPT, "--backend", "vllm", "--model", str(request.target)]
    cmd += ["--host", HOST, "--port", str(port), "--max-concurrency", str(concurrency)]
    cmd += ["--num-prompts", str(num_prompts(request, concurrency))]
    cmd += ["--save-result", "--result-dir", str(result_file.parent)]
    cmd += ["--result-filename", result_file.name, "--temperature", "0", "--seed", str(SEED)]
    cmd += ["--disable-tqdm", "--num-warmups", "0"]  # the server is warmed up once (warm_up)
    return cmd + dataset_flags(request)


def dataset_flags(request: TuneRequest) -> list[str]:
    """The workload: random tokens of ISL/OSL, a prompts file, or a ShareGPT file."""
    name = dataset_name(request)
    eos = ["--ignore-eos"] if request.ignore_eos else []
    if name == "custom":
        template = [] if request.chat_template else ["--skip-chat-template"]
        return [
            "--dataset-name",
            "custom",
            "--dataset-path",
            str(request.prompts),
            "--custom-output-len",
            str(request.osl),
            *template,
            *eos,
        ]
    if name == "sharegpt":
        path = str(request.prompts)
        return [
            "--dataset-name",
            name,
            "--dataset-path",
            path,
            "--sharegpt-output-len",
            str(request.osl),
            *eos,
        ]
    return [
        "--dataset-name",
        "random",
        "--random-input-len",
        str(request.isl),
        "--random-output-len",
        str(request.osl),
        "--ignore-eos",
    ]


class BenchClient:
    """One child running vLLM's benchmark client for each :meth:`run` in turn (a context
    manager: the child is started on entry and its process group killed on exit)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def __enter__(self) -> BenchClient:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", BENCH_LOOP],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
                start_new_session=True,
            )
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.process is None:
            return
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            kill_group(self.process)
            self.process.wait()

    def run(self, cmd: list[str], result_file: Path, log_path: Path, timeout: float) -> BenchResult:
        """One ``vllm bench serve`` run (``cmd``: :func:`bench_command`'s line) to its end; its
        ``--save-result`` file, read. Its output is appended to ``log_path``."""
        process = self.process
        assert process is not None and process.stdin is not None, "use BenchClient in a with"
        self.runs += 1
        done = result_file.with_name(f"{result_file.name}.done")
        start = self.log.stat().st_size
        argv = cmd[cmd.index(BENCH_SCRIPT) + 1 :]
        try:
            process.stdin.write((json.dumps([argv, str(done)]) + "\n").encode())
            process.stdin.flush()
        except BrokenPipeError:  # the client has ended: said below, with its output
            pass
        deadline = time.monotonic() + timeout
        while not done.is_file() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        output = self._output_since(start)
        with log_path.open("ab") as combined:
            combined.write(output)
        tail = output.decode(errors="replace")[-LOG_TAIL_CHARS:]
        if not done.is_file():
            if process.poll() is None:
                raise CheckFailed(f"vllm bench serve did not finish within {timeout:.0f}s")
            raise CheckFailed(
                f"the vllm bench serve client ended (exit code {process.returncode}):\n{tail}"
            )
        status = done.read_text(encoding="utf-8", errors="replace")
        if status != "ok" or not result_file.is_file():
            reason = status.strip().splitlines()[-1] if status.strip() else "no result written"
            raise CheckFailed(f"vllm bench serve failed ({reason}):\n{tail}")
        return cast(BenchResult, dict(json.loads(result_file.read_text())))

    def _output_since(self, start: int) -> bytes:
        with self.log.open("rb") as handle:
            handle.seek(start)
            return handle.read()


def warm_up(request: TuneRequest, url: str, timeout: float) -> None:
    """Every concurrency of the grid in turn, smallest first: that many completions of OSL
    tokens at once, each from its own ISL-token prompt.

    A speculative server meets new step shapes at every batch size (tokens a step, the
    draft's own steps), and vLLM's CPU kernels pay for each new shape once: warmed at the
    largest concurrency only, a speculative server's first round ran 8-24% slower than its
    second on the real pair (no speculation: within 6%). Sent straight to
    ``/v1/completions`` (no bench process to start): the same requests for every
    configuration, before the /metrics snapshot that opens the measurement.
    """
    sent = 0
    for concurrency in sorted(request.concurrencies):
        bodies = [_warm_up_body(request, sent + i) for i in range(concurrency)]
        sent += concurrency
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(partial(_complete, url, timeout), bodies))


def _warm_up_body(request: TuneRequest, index: int) -> bytes:
    """The index-th warm-up request: a prompt no other warm-up or measured prompt shares a
    prefix with (token ids cycling through 1..WARMUP_IDS from their own offset)."""
    start = index * request.isl
    return json.dumps(
        {
            "model": str(request.target),
            "prompt": [1 + (start + i) % WARMUP_IDS for i in range(request.isl)],
            "max_tokens": request.osl,
            "temperature": 0,
            "ignore_eos": True,
        }
    ).encode()


def _complete(url: str, timeout: float, body: bytes) -> None:
    post = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(post, timeout=timeout) as response:
            response.read()
    except OSError as exc:  # URLError, HTTPError, timeouts
        raise CheckFailed(f"the warm-up request to {url} failed: {exc}") from exc


def counted_run(
    bench: BenchClient,
    server: Server,
    request: TuneRequest,
    concurrency: int,
    result_file: Path,
    what: str,
) -> tuple[BenchResult, SpecDecodeCounts | None]:
    """One ``vllm bench serve`` run at ``concurrency`` on ``server`` and the server's /metrics
    delta around it, which must agree with the bench's own file (``what`` names the
    measurement in the error when they differ)."""
    before = parse_counters(server.metrics())
    cmd = bench_command(request, server.port, concurrency, result_file)
    raw = bench.run(cmd, result_file, request.out / "bench.log", request.bench_timeout_s)
    after = parse_counters(server.metrics())
    delta = after - before if after is not None and before is not None else None
    if problem := bench_problem(delta, raw):
        raise CheckFailed(
            f"{what}: acceptance from the server's /metrics and from vllm bench serve differ "
            f"({problem})"
        )
    return raw, delta
