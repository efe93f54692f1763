"""A command stopped by SIGTERM (a CI job's timeout) stops the children it started with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

# A command of the real CLI group that waits on a child the way validate waits on an engine.
SCRIPT = """
import sys, click
from pathlib import Path
from eaglequant.cli import main
from eaglequant.engine.process import run_child

@main.command("wait-on-child")
def wait_on_child():
    run_child([sys.executable, "-c", "import time; time.sleep(120)"], Path(sys.argv[1]),
              {"PATH": "/usr/bin:/bin"}, None)

main(["wait-on-child"])
"""


def test_sigterm_stops_the_engine_children_of_any_command(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    parent = subprocess.Popen([sys.executable, "-c", SCRIPT, str(log)])
    child = _child_of(parent.pid)
    _waiting(parent.pid)
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM
    _assert_gone(child)


# The same command with the signal arriving while the child is being started: after the
# fork and exec, before ``Popen`` returns its handle (the handler runs inside ``__init__``).
MID_START = (
    """
import os, signal, subprocess

class SignalledMidStart(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        print(self.pid, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

subprocess.Popen = SignalledMidStart
"""
    + SCRIPT
)


def test_sigterm_while_a_child_is_being_started_stops_it_too(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MID_START, str(tmp_path / "child.log")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    child = int(done.stdout.split()[0])
    _assert_gone(child)


def _assert_gone(child: int) -> None:
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the child outlived the command"


def _child_of(pid: int) -> int:
    """The command's child once it runs its own program (forked and exec'd: the command
    holds its handle by then, and the signal finds a command waiting on it)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = Path(f"/proc/{pid}/task/{pid}/children")
        for child in found.read_text().split() if found.exists() else []:
            with contextlib.suppress(OSError):
                if b"time.sleep" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
        time.sleep(0.1)
    raise AssertionError("the command started no child")


def _waiting(pid: int) -> None:
    """Until the command's main thread blocks in ``wait4`` (x86-64 syscall 61) on its child,
    where the command waits on an engine (on another architecture: signalled after 30 s)."""
    deadline = time.monotonic() + 30
    syscall = Path(f"/proc/{pid}/task/{pid}/syscall")
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if syscall.read_text().split()[0] == "61":
                return
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = (
        Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}").exists() else ""
    )
    return state != "Z"
