"""Capture with vLLM: the engine the target is served with, with its parallelism.

Tensor (and pipeline) parallelism are vLLM's own, inside each engine. Data
parallelism is replicas: ``data_parallel_size`` engine processes, each running
the whole target (with its tensor parallelism) on a contiguous share of the
rows, all filling one capture file. vLLM's offline data parallel mode is
refused for dense targets and only coordinates MoE expert parallelism, which a
capture does not need. Each replica gets its own devices (the platform's
visible-devices variable, split in order) or, on CPU, its own cores.

Every replica is a child process (:mod:`eaglequant.capture.vllm_child`); the
first to fail stops the others and is reported with the cause and the last
error line of its log.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eaglequant.capture import vllm_child
from eaglequant.capture.records import ReplicaResult, ReplicaSpec, VllmRun
from eaglequant.capture.store import CaptureFile
from eaglequant.engine.config import (
    EngineOptions,
    VllmInstall,
    cpu_thread_binding,
    llm_kwargs,
    platform_env,
    usable_cores,
    worker_count,
)
from eaglequant.engine.process import ChildRun, finish_child, kill_group, start_child
from eaglequant.errors import EngineFailed, InputError

CHUNK = 64
POLL_S = 0.5
ERROR_LINE = re.compile(r"^\s*(\w+\.)*\w*(Error|Exception|Exit)\b.*")


def replica_rows(rows: int, replicas: int) -> list[tuple[int, int]]:
    """Contiguous [first, end) shares of ``rows``, as even as possible, none empty."""
    replicas = min(replicas, rows)
    base, extra = divmod(rows, replicas)
    shares, first = [], 0
    for r in range(replicas):
        end = first + base + (1 if r < extra else 0)
        shares.append((first, end))
        first = end
    return shares


def replica_env(
    env: Mapping[str, str], install: VllmInstall, workers: int, replica: int, replicas: int
) -> dict[str, str]:
    """Environment for one replica: its devices, or on CPU its cores and the platform's defaults."""
    added = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # the connector's writes need the busy loop
    if install.on_cpu:
        cores = _replica_cores(env, workers, replica, replicas)
        added |= platform_env(env, True, workers, cores)
        if replicas > 1:  # a single worker too: each replica keeps to its own cores
            added["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(cores, workers)
    elif replicas > 1:
        added[install.device_env] = _replica_devices(env, install, workers, replica)
    return dict(env) | added


def _replica_cores(env: Mapping[str, str], workers: int, replica: int, replicas: int) -> list[int]:
    if "VLLM_CPU_OMP_THREADS_BIND" in env and replicas > 1:
        raise InputError(
            "VLLM_CPU_OMP_THREADS_BIND is set, but data parallel replicas need one core "
            "range each; unset it and the tool splits the cores"
        )
    cores = usable_cores()
    per = len(cores) // replicas
    if per < workers:
        raise InputError(
            f"{replicas} replicas x {workers} workers need {replicas * workers} cores, "
            f"this process may use {len(cores)}; lower the parallelism"
        )
    return cores[replica * per : (replica + 1) * per]


def _replica_devices(
    env: Mapping[str, str], install: VllmInstall, workers: int, replica: int
) -> str:
    visible = env.get(install.device_env, "")
    devices = visible.split(",") if visible else [str(i) for i in range(install.device_count)]
    mine = devices[replica * workers : (replica + 1) * workers]
    if len(mine) < workers:
        raise InputError(
            f"data parallel replica {replica} needs {workers} devices, only {len(devices)} are "
            f"visible ({install.device_env}); lower the parallelism"
        )
    return ",".join(mine)


def capture_vllm(
    target: Path,
    file: CaptureFile,
    aux_ids: tuple[int, ...],
    *,
    options: EngineOptions,
    install: VllmInstall,
    replicas: int,
    scratch: Path,
    timeout_s: float | None,
    progress: Callable[[str], None],
) -> VllmRun:
    """Fill every row of ``file`` with vLLM replicas; returns the engine's record."""
    kwargs = llm_kwargs(options, str(target), None)
    kwargs.pop("speculative_config")
    workers = worker_count(kwargs)
    shares = replica_rows(file.rows, replicas)
    envs = [replica_env(os.environ, install, workers, r, len(shares)) for r in range(len(shares))]
    with tempfile.TemporaryDirectory(prefix="eaglequant-capture-logs-") as logs:
        runs = _run_replicas(target, file, aux_ids, kwargs, shares, envs, scratch, Path(logs))
        results = _collect(runs, timeout_s, progress)
    return {
        "name": "vllm",
        "vllm": results[0]["engine_config"]["vllm"],
        "platform": results[0]["platform"],
        "tensor_parallel_size": options.tensor_parallel_size,
        "pipeline_parallel_size": int(kwargs.get("pipeline_parallel_size") or 1),
        "data_parallel_size": len(shares),
        "engine_args": dict(options.engine_args),
        "replicas": results,
        "load_s": max(r["load_s"] for r in results),
        "run_s": max(r["run_s"] for r in results),
    }


class _Replica:
    """One running replica: its process, log, result path and rows."""

    def __init__(self, index: int, argv: list[str], env: dict[str, str], folder: Path) -> None:
        self.index, self.log, self.result = index, folder / "engine.log", folder / "result.json"
        self.started = time.perf_counter()
        self.process = start_child(argv, self.log, env)


def _run_replicas(
    target: Path,
    file: CaptureFile,
    aux_ids: tuple[int, ...],
    kwargs: dict[str, Any],
    shares: list[tuple[int, int]],
    envs: list[dict[str, str]],
    scratch: Path,
    logs: Path,
) -> list[_Replica]:
    replicas = []
    for index, (share, env) in enumerate(zip(shares, envs, strict=True)):
        folder = logs / f"replica-{index}"
        folder.mkdir()
        storage = scratch / f"replica-{index}"
        storage.mkdir(parents=True)
        spec: ReplicaSpec = {
            "llm": kwargs,
            "aux_layer_ids": list(aux_ids),
            "file": str(file.path),
            "rows": list(share),
            "scratch": str(storage),
            "chunk": CHUNK,
        }
        (folder / "spec.json").write_text(json.dumps(spec))
        argv = vllm_child.CHILD.argv(folder / "spec.json", folder / "result.json")
        replicas.append(_Replica(index, argv, env, folder))
    return replicas


def _collect(
    replicas: list[_Replica], timeout_s: float | None, progress: Callable[[str], None]
) -> list[ReplicaResult]:
    """Wait for all; the first failure kills the rest and raises EngineFailed."""
    pending = list(replicas)
    try:
        while pending:
            for replica in list(pending):
                waited = time.perf_counter() - replica.started
                if replica.process.poll() is None and (timeout_s is None or waited < timeout_s):
                    continue
                left = None if replica.process.returncode is not None else 0.0
                ended = finish_child(replica.process, replica.started, left)
                if not (ended.ok and replica.result.is_file()):
                    raise EngineFailed(_failure(replica, ended))
                progress(f"vLLM capture replica {replica.index} done ({ended.wall_s:.0f}s)")
                pending.remove(replica)
            time.sleep(POLL_S)
    finally:
        for replica in pending:
            kill_group(replica.process)
            replica.process.wait()
    return [json.loads(r.result.read_text()) for r in replicas]


def _failure(replica: _Replica, ended: ChildRun) -> str:
    text = replica.log.read_text(encoding="utf-8", errors="replace")
    return (
        f"vLLM capture engine (replica {replica.index}) failed ({ended.cause()}): "
        f"{last_error(text)[:400]}"
    )


def last_error(log: str) -> str:
    """The log's last exception line, with its indented detail line (pydantic puts the
    reason there), else its last line."""
    lines = [line.rstrip() for line in log.splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        if ERROR_LINE.match(lines[index]):
            detail = lines[index + 1 : index + 2]
            if detail and detail[0][:1].isspace():
                return f"{lines[index].strip()}: {detail[0].strip()}"
            return lines[index].strip()
    return lines[-1].strip() if lines else "(no output)"
