"""An engine child dies on a fatal signal, whatever handler a library installed before."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

# A library's crash handler that never returns (as tvm_ffi's can, on a corrupted heap), then
# an abort; with ``reset`` the child first calls die_on_fatal_signals.
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    signal.signal(signal.SIGABRT, lambda *_: time.sleep(60))
    if sys.argv[1] == "reset":
        from eaglequant.engine.child import die_on_fatal_signals
        die_on_fatal_signals()
    os.kill(os.getpid(), signal.SIGABRT)
    time.sleep(60)
    """
)


def test_a_fatal_signal_ends_the_child_with_its_stack_after_the_reset() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "reset"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in done.stderr


def test_without_the_reset_the_library_handler_keeps_the_child_waiting() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", CHILD, "keep"], capture_output=True, timeout=3)
