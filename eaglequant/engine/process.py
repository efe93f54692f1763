"""Engine child processes: each vLLM run in its own process group, bounded, its end named.

A vLLM engine can abort (a kernel library for another CPU), be killed (out of
memory) or hang; running it as a child keeps the tool alive to report which,
and killing the whole process group leaves no engine core or worker behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from eaglequant.engine.forkserver import ForkedChild, server_for, wanted

# How much of a failed child's log a report or an error carries (its last characters).
LOG_TAIL_CHARS = 4000


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


def run_child(
    argv: list[str], log: Path, env: Mapping[str, str], timeout: float | None
) -> ChildRun:
    """Run one child to its end (or ``timeout``); its output goes to ``log``."""
    started = time.perf_counter()
    return finish_child(start_child(argv, log, env), started, timeout)
