"""A fork server for engine children: import each child module once, fork every run from it.

An engine child (a validate engine, a capture replica) is a fresh interpreter that imports
vLLM, then works a few seconds on a small model; on a 2-core CPU the import alone is ~16 s.
With ``EAGLEQUANT_FORKSERVER=1`` in the child's environment,
:func:`eaglequant.engine.process.start_child` asks a fork server instead: one process per
environment that imports each child module (and the heavy modules the module names in
``PRELOAD``) the first time it is asked for it, then forks a child per request. The child
runs the module as ``python -m`` would, in its own session, its output in its log, with the
requester's working directory and CPU affinity. The server reports each child's exit
status, so the requester waits, times out and kills the child's group as for any child.

vLLM forks its own workers from processes that have imported it, which is what this
relies on; the server refuses a module whose import leaves a Python thread running (a
fork copies only the forking thread) and the requester then starts that child as a plain
subprocess. Off by default: a run that loads a large target spends minutes loading, not
importing; test suites and sessions of many small runs are what it is for.

Run as ``python -m eaglequant.engine.forkserver`` by :class:`ForkServer` (the server side is
:func:`serve`): JSON lines on stdin (one request at a time), JSON lines on stdout (the reply
to each request, then each child's exit).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import queue
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, final

from eaglequant.engine.config import usable_cores
from eaglequant.interpreter import collection_paused, exit_at_once, import_all
from eaglequant.io.output import pid_alive

FORKSERVER_ENV = "EAGLEQUANT_FORKSERVER"
# Fork servers one process keeps (the least recently used is closed): each holds vLLM.
MAX_SERVERS = 4
# Variables a server's key leaves out (the child still gets their values): pytest's name of
# the running test, which changes with every test and which no import reads.
UNKEYED = frozenset({"PYTEST_CURRENT_TEST"})
# How long a requester waits for the server's reply (it may be importing vLLM first).
REPLY_TIMEOUT_S = 900.0


class ForkRequest(TypedDict):
    """One request to the server: run ``module args`` with this log, directory, environment
    and CPU affinity."""

    module: str
    args: list[str]
    env: dict[str, str]
    log: str
    cwd: str
    affinity: list[int]


@final  # a reply is one or the other ('in' tells them apart)
class Started(TypedDict):
    started: int  # the forked child's pid


@final  # a reply is one or the other ('in' tells them apart)
class Refused(TypedDict):
    refused: str  # why the server would not fork the child


class Exited(TypedDict):
    exited: int  # a forked child's pid
    code: int  # its exit status


class Reply(TypedDict, total=False):
    """The requester's answer to a request: the forked child, or why there is none (empty:
    the server ended)."""

    child: ForkedChild
    refused: str


def wanted(env: Mapping[str, str]) -> bool:
    """Whether a child with this environment should be forked from a server."""
    return env.get(FORKSERVER_ENV) == "1"


# --- the server --------------------------------------------------------------------------


def serve() -> None:
    """Answer requests until stdin closes, then report the children still running as they end."""
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # a stray print from an import cannot corrupt the replies
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    own = (requests, replies, wake_r, wake_w, null)
    children: set[int] = set()
    pending, open_ = b"", True
    while open_ or children:
        ready, _, _ = select.select([requests, wake_r] if open_ else [wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
        if requests in ready:
            chunk = os.read(requests, 1 << 16)
            open_ = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                reply = _start(json.loads(line), own)
                children.update([reply["started"]] if "started" in reply else [])
                _send(replies, reply)
        children -= _reap(replies)


def _send(fd: int, message: Started | Refused | Exited) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _reap(replies: int) -> set[int]:
    ended: set[int] = set()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.add(pid)
        _send(replies, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _start(request: ForkRequest, own: tuple[int, ...]) -> Started | Refused:
    module = str(request["module"])
    try:
        with collection_paused():
            loaded = importlib.import_module(module)
        import_all(getattr(loaded, "PRELOAD", ()))
    except BaseException as exc:  # the plain subprocess the requester starts will say why
        return {"refused": f"importing {module}: {exc!r}"}
    if threading.active_count() != 1:
        return {"refused": f"importing {module} started a thread"}
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(request, module, own)
    return {"started": pid}


def _child(request: ForkRequest, module: str, own: tuple[int, ...]) -> None:
    """Become ``python -m module args…`` in a new session; never returns."""
    code = 1
    try:
        name_process(module)
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in own:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("affinity") and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, request["affinity"])
        sys.argv = [module, *request["args"]]
        sys.modules.pop(module, None)  # run afresh as __main__, as ``python -m`` does

        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
    finally:
        exit_at_once(code)


def process_name(module: str) -> str:
    """The name a forked child shows in ``/proc/PID/comm`` (its command line is the server's)."""
    return module.rsplit(".", 1)[-1][:15]


def name_process(module: str) -> None:
    """Name this process after ``module`` (Linux ``prctl(PR_SET_NAME)``; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, process_name(module).encode(), 0, 0, 0)  # 15: PR_SET_NAME


def _exit_code(code: object) -> int:
    """``sys.exit``'s argument as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


# --- the requester -----------------------------------------------------------------------


class ForkedChild:
    """A child the server forked: ``pid``, ``poll``, ``wait`` and ``returncode`` like a Popen."""

    def __init__(self, pid: int, args: list[str], server: ForkServer) -> None:
        self.pid, self.args, self.server = pid, args, server
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        if not self._ended.is_set() and not self.server.alive and not pid_alive(self.pid):
            self._end(-signal.SIGKILL)  # the server died with it: its status is lost
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._ended.wait(0.5 if left is None else min(left, 0.5))
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """One server process (its environment fixed) and the children it forked."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(
            [python, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
        )
        self.alive = True
        self._children: dict[int, ForkedChild] = {}
        self._replies: queue.Queue[Reply] = queue.Queue()
        self._request = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def start(
        self, module: str, args: list[str], log: Path, env: Mapping[str, str]
    ) -> ForkedChild | str:
        """The forked child running ``module args`` in ``env`` (this server's, but for
        :data:`UNKEYED`), or why the server would not fork it."""
        request: ForkRequest = {
            "module": module,
            "args": args,
            "env": dict(env),
            "log": str(log),
            "cwd": os.getcwd(),
            "affinity": usable_cores(),
        }
        log.write_bytes(b"")  # there once the child is started, as for a plain subprocess
        with self._request:
            if not self.alive:
                return "the fork server has ended"
            assert self.process.stdin is not None
            try:
                self.process.stdin.write(json.dumps(request).encode() + b"\n")
                self.process.stdin.flush()
                reply = self._replies.get(timeout=REPLY_TIMEOUT_S)
            except (BrokenPipeError, ValueError, queue.Empty):
                self.close()
                return "the fork server did not answer"
            if not reply:
                return "the fork server has ended"
        child = reply.get("child")
        if isinstance(child, ForkedChild):
            child.args = [module, *args]
            return child
        return str(reply.get("refused") or "the fork server has ended")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            if "started" in message:
                pid = int(message["started"])
                self._children[pid] = ForkedChild(pid, [], self)
                self._replies.put({"child": self._children[pid]})
            elif "exited" in message:
                child = self._children.pop(int(message["exited"]), None)
                if child is not None:
                    child._end(int(message["code"]))
            else:
                self._replies.put(message)
        self.alive = False
        self._replies.put({})
        self.process.wait()

    def close(self) -> None:
        """No more requests; the server ends once the children it forked have ended."""
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()


_servers: dict[tuple[str, frozenset[tuple[str, str]]], ForkServer] = {}
_servers_lock = threading.Lock()


def server_for(python: str, env: Mapping[str, str]) -> ForkServer:
    """This process's server for ``python`` and ``env`` (but :data:`UNKEYED`; started on first
    use)."""
    key = (python, frozenset((k, v) for k, v in env.items() if k not in UNKEYED))
    with _servers_lock:
        server = _servers.pop(key, None)
        if server is None or not server.alive:
            server = ForkServer(python, env)
        _servers[key] = server  # most recently used last
        while len(_servers) > MAX_SERVERS:
            _servers.pop(next(iter(_servers))).close()
        return server


@atexit.register
def _close_all() -> None:
    with _servers_lock:
        while _servers:
            _servers.popitem()[1].close()


if __name__ == "__main__":
    serve()
