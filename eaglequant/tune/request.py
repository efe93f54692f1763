"""What ``eaglequant tune`` is asked to measure, checked before any server starts.

``TuneRequest`` holds the target, the draft (and for a comparison the baseline
draft), the ks, concurrencies, workload and serve arguments; ``check_request``
refuses what would fail later; ``engine_flags`` and ``serve_line`` give the one
``vllm serve`` command line every configuration shares, differing only in its
``--speculative-config``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eaglequant.engine.config import (
    EngineOptions,
    check_engine_args,
    check_kv_cache_dtype,
    device_count,
    platform_env,
    probe_vllm,
    serve_flags,
    usable_cores,
    worker_count,
)
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_checkpoint, read_config
from eaglequant.results.tune_summary import Workload
from eaglequant.rules.draft import structure_problems
from eaglequant.rules.speculative import SpeculativeDict, draft_kv_cache_dtype, kv_source
from eaglequant.tune.choice import schedule_problem

# How the two servers of a comparison round are run: each configuration's server
# started and stopped inside every round, or all started once and kept alive.
RESTART = "restart"
KEEP = "keep"
# tune --predict --baseline: each configuration served once, its rounds inside that server.
ONCE = "once"
# vllm bench serve's datasets tune drives: random tokens of ISL/OSL, a .jsonl of prompts
# (custom), a ShareGPT .json (conversations; OSL tokens generated for each).
DATASETS = ("random", "custom", "sharegpt")


@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    target: Path
    draft: Path
    # Compare ``draft`` against this draft (and no speculation) instead of sweeping k.
    baseline: Path | None = None
    ks: tuple[int, ...] = (4, 6, 8)
    concurrencies: tuple[int, ...] = (4, 8, 16, 32, 64)
    isl: int = 1024
    osl: int = 1024
    prompts: Path | None = None
    # The prompts as the user named them (a set's name, or the path given), for the results:
    # a set's resolved file lies in this machine's cache.
    prompts_source: str | None = None
    # None: custom where prompts are given, else random.
    dataset: str | None = None
    # The custom prompts through the target's chat template (vLLM's bench applies it), and
    # every answer generated to OSL tokens: validate's workload, for figures that compare.
    chat_template: bool = False
    ignore_eos: bool = False
    num_prompts: int | None = None
    repeats: int = 3
    # Measure this schedule (first batch size, last, k) instead of the one built from the winners.
    schedule: tuple[tuple[int, int, int], ...] | None = None
    serve_args: tuple[str, ...] = ()
    engine: EngineOptions = field(default_factory=EngineOptions)
    servers: str = RESTART
    out: Path = Path("tune-results")
    server_timeout_s: float = 600.0
    bench_timeout_s: float = 1800.0
    command: str | None = None  # how it was invoked, path-free (eaglequant.results.provenance)
    draft_kv_cache_dtype: str | None = None  # None: the draft's KV cache as the target's
    # Serve no speculation and the largest k, predict the rest (eaglequant.tune.predict) and
    # serve only the ks the recommendation rests on.
    predict: bool = False


def _max_model_len(request: TuneRequest) -> int | None:
    if request.engine.max_model_len is not None:
        return request.engine.max_model_len
    for i, arg in enumerate(request.serve_args):
        if arg.startswith("--max-model-len"):
            value = arg.split("=", 1)[1] if "=" in arg else request.serve_args[i + 1]
            return int(value)
    return None


# Activation dtypes vLLM's quark method takes (a quantized draft runs in the target's dtype).
QUARK_DTYPES = ("auto", "bfloat16", "float16", "half")


def _check_draft(path: Path, dtype: str) -> None:
    checkpoint = read_checkpoint(path)
    problems = [p for p in structure_problems(checkpoint) if not p.loadable]
    if problems:  # the same recognition as export and validate (plain-Llama form included)
        raise InputError(str(problems[0]))
    method = (checkpoint.flat_config.get("quantization_config") or {}).get("quant_method")
    if method == "quark" and dtype not in QUARK_DTYPES:
        raise InputError(
            f"{path}: a Quark-quantized draft runs in the target's dtype, and vLLM's quark "
            f"method takes bfloat16 or float16, not {dtype}; drop dtype={dtype}"
        )


def with_draft_kv_cache(request: TuneRequest) -> TuneRequest:
    """The request with the draft's KV cache dtype resolved (FP8 for calibrated K/V scales)."""
    kv = draft_kv_cache_dtype(request.draft_kv_cache_dtype, read_config(request.draft))
    return replace(request, draft_kv_cache_dtype=kv)


def check_request(request: TuneRequest) -> int:
    """Fail before any server starts; return the max-model-len to serve with."""
    if not request.target.is_dir():
        raise InputError(f"{request.target}: no such target folder; pass the target model's folder")
    read_config(request.target)
    dtype = str(request.engine.engine_args.get("dtype", "auto"))
    _check_draft(request.draft, dtype)
    if request.baseline is not None:
        _check_draft(request.baseline, dtype)
        if request.schedule is not None:
            raise InputError(
                "a baseline comparison measures single ks; drop the schedule or the baseline"
            )
    if request.predict and request.servers == KEEP:
        raise InputError(
            "--predict serves each configuration once, one at a time; drop --keep-servers"
        )
    if request.predict and len(set(request.concurrencies)) < 2:
        raise InputError(
            "--predict fits the target's step time over concurrencies: give 2 or more, "
            "e.g. --concurrency 1,8"
        )
    if request.prompts is not None and not request.prompts.is_file():
        raise InputError(f"{request.prompts}: no such prompts file")
    if request.dataset is not None and request.dataset not in DATASETS:
        raise InputError(f"dataset {request.dataset!r}: use one of {', '.join(DATASETS)}")
    if dataset_name(request) != "random" and request.prompts is None:
        raise InputError(f"the {dataset_name(request)} dataset reads a file; pass the prompts")
    if request.repeats < 1:
        raise InputError(f"repeats {request.repeats}: measure each point at least once")
    if request.servers not in (RESTART, KEEP):
        raise InputError(f"servers {request.servers!r}: use {RESTART!r} or {KEEP!r}")
    if request.schedule is not None and (problem := schedule_problem(request.schedule)):
        raise InputError(f"schedule {list(request.schedule)}: {problem}")
    install = probe_vllm(sys.executable)
    install.require("tune", "benchmark client")
    check_engine_args(request.engine.engine_args, install.engine_args)
    check_kv_cache_dtype(request.draft_kv_cache_dtype, install, kv_source(request.draft))
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
    # k more positions than vLLM needs: with fewer, vLLM's CPU build drafts worse for the whole
    # batch (docs/known-issues.md), and the sweep would measure that instead of the draft
    return max_len or needed + largest


def dataset_name(request: TuneRequest) -> str:
    if request.dataset is not None:
        return request.dataset
    return "random" if request.prompts is None else "custom"


def engine_flags(request: TuneRequest, spec: SpeculativeDict | None, max_len: int) -> list[str]:
    """Everything after the model and address: parallelism, engine and serve arguments, spec."""
    flags = ["--tensor-parallel-size", str(request.engine.tensor_parallel_size)]
    if not any(arg.startswith("--max-model-len") for arg in request.serve_args):
        flags += ["--max-model-len", str(max_len)]
    flags += serve_flags(request.engine.engine_args) + list(request.serve_args)
    if spec is not None:
        flags += ["--speculative-config", json.dumps(spec)]
    return flags


def serve_line(request: TuneRequest, spec: SpeculativeDict | None, max_len: int) -> str:
    """The ``vllm serve`` command a reader runs to reproduce one configuration."""
    return shlex.join(["vllm", "serve", str(request.target), *engine_flags(request, spec, max_len)])


def engine_kwargs(request: TuneRequest) -> dict[str, Any]:
    """The parallelism the target is served with, as ``EngineArgs`` fields."""
    return {
        "tensor_parallel_size": request.engine.tensor_parallel_size,
        **request.engine.engine_args,
    }


def serve_env(request: TuneRequest) -> dict[str, str]:
    """This environment plus what the platform needs (CPU: KV cache space, core binding)."""
    on_cpu = probe_vllm(sys.executable).on_cpu
    workers = worker_count(engine_kwargs(request))
    return dict(os.environ) | platform_env(os.environ, on_cpu, workers, usable_cores())


def devices(request: TuneRequest) -> tuple[int, str]:
    """How many devices the target is served on, and what one is (GPU, or CPU worker)."""
    unit = "CPU worker" if probe_vllm(sys.executable).on_cpu else "GPU"
    return device_count(engine_kwargs(request)), unit


def workload(request: TuneRequest, max_len: int) -> Workload:
    """The part of results.json that says what was served and how it was driven."""
    return {
        "target": str(request.target),
        "draft": str(request.draft),
        "ks": list(request.ks),
        "concurrencies": list(request.concurrencies),
        "isl": request.isl,
        "osl": request.osl,
        "repeats": request.repeats,
        "prompts": request.prompts_source or (str(request.prompts) if request.prompts else None),
        "dataset": dataset_name(request),
        "max_model_len": max_len,
        "tensor_parallel_size": request.engine.tensor_parallel_size,
        "engine_args": dict(request.engine.engine_args),
        "command": request.command,
    }
