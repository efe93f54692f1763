"""``vllm bench serve`` against one running server: its command line, its run, its result.

vLLM's own benchmark client is run as a child (this interpreter, ``vllm.benchmarks.serve``)
with ``--save-result``; the result file is what tune records. The workload (random
tokens of ISL/OSL, or a prompts file) and the seed are the same for every configuration.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from eaglequant.engine.process import log_tail, run_child
from eaglequant.engine.server import HOST
from eaglequant.errors import CheckFailed
from eaglequant.tune.request import TuneRequest, dataset_name

BENCH_SCRIPT = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
SEED = 0
# Warm-up prompts are token ids cycling through 1..WARMUP_IDS (inside any real vocabulary):
# exactly ISL tokens, and no prefix that a measured prompt could find cached.
WARMUP_IDS = 1000


def num_prompts(request: TuneRequest, concurrency: int) -> int:
    return request.num_prompts or max(2 * concurrency, 8)


def bench_command(
    request: TuneRequest,
    port: int,
    concurrency: int,
    result_file: Path,
    *,
    warmups: int = 0,
) -> list[str]:
    """The ``vllm bench serve`` command line for one measurement at ``concurrency``."""
    cmd = [sys.executable, "-c", BENCH_SCRIPT, "--backend", "vllm", "--model", str(request.target)]
    cmd += ["--host", HOST, "--port", str(port), "--max-concurrency", str(concurrency)]
    cmd += ["--num-prompts", str(num_prompts(request, concurrency))]
    cmd += ["--save-result", "--result-dir", str(result_file.parent)]
    cmd += ["--result-filename", result_file.name, "--temperature", "0", "--seed", str(SEED)]
    cmd += ["--disable-tqdm", "--num-warmups", str(warmups)]
    return cmd + dataset_flags(request)


def dataset_flags(request: TuneRequest) -> list[str]:
    """The workload: random tokens of ISL/OSL, a prompts file, or a ShareGPT file."""
    name = dataset_name(request)
    if name == "custom":
        return [
            "--dataset-name",
            "custom",
            "--dataset-path",
            str(request.prompts),
            "--custom-output-len",
            str(request.osl),
            "--skip-chat-template",
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


def run_bench(cmd: list[str], result_file: Path, log_path: Path, timeout: float) -> dict[str, Any]:
    """Run one ``vllm bench serve`` child to its end; its ``--save-result`` file, read."""
    log = result_file.with_suffix(".log")
    done = run_child(cmd, log, os.environ, timeout)
    with log_path.open("ab") as combined:
        combined.write(log.read_bytes())
    if done.timed_out:
        raise CheckFailed(f"vllm bench serve did not finish within {timeout:.0f}s")
    if not done.ok or not result_file.is_file():
        raise CheckFailed(f"vllm bench serve failed ({done.cause()}):\n{log_tail(log)}")
    return dict(json.loads(result_file.read_text()))


def warm_up(request: TuneRequest, url: str, concurrency: int, timeout: float) -> None:
    """``concurrency`` completions of OSL tokens at once (ISL-token prompts) on one server.

    Sent straight to ``/v1/completions`` (no bench process to start): the same requests
    for every configuration, before the /metrics snapshot that opens the measurement.
    """
    body = json.dumps(
        {
            "model": str(request.target),
            "prompt": [1 + i % WARMUP_IDS for i in range(request.isl)],
            "max_tokens": request.osl,
            "temperature": 0,
            "ignore_eos": True,
        }
    ).encode()

    def complete(_: int) -> None:
        post = urllib.request.Request(
            f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(post, timeout=timeout) as response:
                response.read()
        except OSError as exc:  # URLError, HTTPError, timeouts
            raise CheckFailed(f"the warm-up request to {url} failed: {exc}") from exc

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(complete, range(concurrency)))
