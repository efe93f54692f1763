"""The export's clock: spans into a dict (also of work in a thread), and the process's own start."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from eaglequant.quantize.timing import InThread, timed


def test_process_started_covers_interpreter_and_imports() -> None:
    script = (
        "import time; time.sleep(0.3)\n"
        "from eaglequant.quantize.timing import process_started\n"
        "print(time.perf_counter() - process_started())\n"
    )
    age = float(
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        ).stdout
    )
    assert 0.3 <= age < 10


def test_timed_records_also_when_the_block_raises() -> None:
    timings: dict[str, float] = {}
    with pytest.raises(ValueError), timed(timings, "stage"):
        raise ValueError
    assert timings["stage"] >= 0


def test_work_in_a_thread_is_timed_and_its_error_raised_in_the_caller() -> None:
    timings: dict[str, float] = {}
    ran: list[str] = []
    done = InThread(lambda: ran.append(threading.current_thread().name), timings, "copy")
    done.wait()
    done.raise_error()  # nothing to raise
    assert ran == ["eaglequant-copy"] and timings["copy"] >= 0

    def fails() -> None:
        raise OSError(28, "No space left on device")

    failed = InThread(fails, timings, "stage")
    failed.wait()
    assert "stage" in timings
    with pytest.raises(OSError, match="No space left"):
        failed.raise_error()
    failed.raise_error()  # raised once: a second call has nothing left

    assert InThread(lambda: 42, timings, "measure").result() == 42
    with pytest.raises(OSError, match="No space left"):
        InThread(fails, timings, "write").result()
