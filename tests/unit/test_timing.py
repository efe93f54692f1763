"""The export's clock: spans into a dict, and the process's own start on the same clock."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eaglequant.quantize.timing import timed


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
