"""Stopping a server's process group: nothing of it is left when stop returns."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eaglequant.engine.process import wait_group_gone
from eaglequant.engine.server import stop_group

pytestmark = pytest.mark.unit

# A leader that ignores SIGTERM and a member holding 128 MiB it has touched, as vLLM's API
# server, engine core and worker hold theirs.
GROUP = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', "
    "'import time; b = bytearray(128 << 20); print(1, flush=True); time.sleep(600)'])\n"
    "time.sleep(600)\n"
)


def _group(tmp_path: Path) -> subprocess.Popen[bytes]:
    log = tmp_path / "group.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", GROUP], stdout=out, start_new_session=True
        )
    while log.read_text() != "1\n":  # the member holds its memory
        assert process.poll() is None
        time.sleep(0.01)
    return process


def test_stop_returns_when_every_member_of_the_group_is_gone(tmp_path: Path) -> None:
    process = _group(tmp_path)
    stop_group(process, grace=0.2)
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)


def test_a_group_still_there_is_reported_after_the_timeout(tmp_path: Path) -> None:
    process = _group(tmp_path)
    try:
        assert not wait_group_gone(process, timeout=0.2)
    finally:
        stop_group(process, grace=0.0)
    assert wait_group_gone(process, timeout=0.0)
