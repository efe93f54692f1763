"""The small-shape export benchmark runs end to end (a smoke test: nothing is timed here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_small_benchmark_runs_and_ptpc_matches_quark(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "export_bench.py"),
            "--shape",
            "small",
            "--tokens",
            "512",
            "--results",
            str(tmp_path / "results.json"),
        ],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["ptpc_equals_quark"] is True
    assert set(results["static_stages_s"]) >= {"load", "calibrate", "quantize", "write", "verify"}
    assert results["static_calibration"]["tokens"] == 512
    assert results["static_flop"]["calibration"] > 0
    assert results["static_stages_s"]["quantize.quark_calibration"] > 0
    (static,) = results["static_runs"]  # one run: its own floor, the top-level figures
    assert static["order"] == [""] and static["io_floor"]["wall_s"] > 0
    assert static["static_stages_s"] == results["static_stages_s"]
    assert results["io_floor"] == results["ptpc_runs"][0]["io_floor"]
