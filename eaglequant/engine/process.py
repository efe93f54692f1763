"""Engine child processes: each vLLM run in its own process group, bounded, its end named.

A vLLM engine can abort (a kernel library for another CPU), be killed (out of
memory) or hang; running it as a child keeps the tool alive to report which,
and killing the whole process group leaves no engine core or worker behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeAlias, TypeVar

from eaglequant import termination
from eaglequant.engine.child import EngineChild
from eaglequant.engine.forkserver import ForkedChild, server_for, wanted

# How much of a failed child's log a report or an error carries (its last characters).
LOG_TAIL_CHARS = 4000
GROUP_GONE_S = 30.0  # how long a stopped group may take to free its memory


def log_tail(log: str | Path) -> str:
    """The last :data:`LOG_TAIL_CHARS` of a child's log (text, or the log file)."""
    text = log if isinstance(log, str) else log.read_text(encoding="utf-8", errors="replace")
    return text[-LOG_TAIL_CHARS:]


@dataclass(frozen=True)
class ChildRun:
    """How one child process ended."""

    returncode: int | None
    timed_out: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def cause(self) -> str:
        """Timed out, killed by a signal (SIGILL, SIGABRT …), or its exit code."""
        code = self.returncode
        if self.timed_out:
            return "timed out"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
            return f"killed by signal {-code}"
        return f"exit code {code}" if code else "no result written"


# A running child: a plain subprocess, or one forked by a fork server (the same interface).
Child: TypeAlias = "subprocess.Popen[bytes] | ForkedChild"


def start_child(argv: list[str], log: Path, env: Mapping[str, str], *, fork: bool = True) -> Child:
    """Start ``argv`` in a new process group, stdout and stderr into ``log``.

    With ``fork``, ``python -m module …`` is forked from this environment's fork server when
    the environment asks for one (:mod:`eaglequant.engine.forkserver`) and the server takes it.
    """
    with termination.held():  # a SIGTERM meanwhile: the child is stopped, then the exit
        child = _start(argv, log, env, fork)
        if termination.pending():
            kill_group(child)
            child.wait()
    return child


def _start(argv: list[str], log: Path, env: Mapping[str, str], fork: bool) -> Child:
    if fork and wanted(env) and len(argv) >= 3 and argv[1] == "-m":
        forked = server_for(argv[0], env).start(argv[2], argv[3:], log, env)
        if isinstance(forked, ForkedChild):
            return forked
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True
        )


def finish_child(process: Child, started: float, timeout: float | None) -> ChildRun:
    """Wait for ``process`` (at most ``timeout`` s), then kill what is left of its group."""
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        kill_group(process)
    return ChildRun(process.returncode, timed_out, round(time.perf_counter() - started, 1))


def kill_group(process: Child) -> None:
    """SIGKILL the child's process group (no stray engine core or worker survives it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def wait_group_gone(process: Child, timeout: float = GROUP_GONE_S) -> bool:
    """Wait until no process of the child's group is left; False if one still is after
    ``timeout`` s. A killed engine core or worker frees its gigabytes as it goes (a 2 GiB
    process took 1.2 s here): whatever starts next (a server, a measurement) would
    share the cores with that."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def run_child(
    argv: list[str], log: Path, env: Mapping[str, str], timeout: float | None
) -> ChildRun:
    """Run one child to its end (or ``timeout``); its output goes to ``log``."""
    started = time.perf_counter()
    return finish_child(start_child(argv, log, env), started, timeout)


Result = TypeVar("Result")
SpecT = TypeVar("SpecT", bound=Mapping[str, Any])


@dataclass(frozen=True)
class EngineChildOutcome(Generic[Result]):
    """How an engine child ended, its log, and what it wrote: its result (None unless it
    ended well and wrote one) and, when it ended early, the partial result it left."""

    ended: ChildRun
    log: str
    result: Result | None
    partial: Result | None = None


def run_engine_child(
    child: EngineChild[SpecT, Any],
    spec: SpecT,
    *,
    read: Callable[[Path], Result],
    timeout: float | None,
    partial_key: str | None = None,
) -> EngineChildOutcome[Result]:
    """Run ``child`` (``python -m`` its module ``SPEC OUT``) in a scratch folder: ``spec`` as
    ``spec.json``, the child's output read back from ``out.json`` with ``read`` (which checks its
    schema), its log kept. With ``partial_key`` the spec also names a file for what the child
    finished before it ended, read back only when it did not end well. vLLM's engine core runs in
    the child's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the environment sets
    it)."""
    with tempfile.TemporaryDirectory(prefix="eaglequant-engine-") as scratch:
        folder = Path(scratch)
        spec_path, out_path = folder / "spec.json", folder / "out.json"
        log_path, partial_path = folder / "engine.log", folder / "partial.json"
        if partial_key is not None:
            spec_path.write_text(json.dumps({**spec, partial_key: str(partial_path)}))
        else:
            spec_path.write_text(json.dumps(spec))
        child_env = dict(os.environ)
        child_env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        ended = run_child(child.argv(spec_path, out_path), log_path, child_env, timeout)
        log = log_path.read_text(encoding="utf-8", errors="replace")
        done = ended.ok and out_path.is_file()
        result = read(out_path) if done else None
        left = partial_key is not None and not done and partial_path.is_file()
        return EngineChildOutcome(ended, log, result, read(partial_path) if left else None)
