"""The suite's parallel pass: xdist workers pinned to their own cores, TP/DP tests kept out.

Each case runs pytest in a child on a small test file, with tests/parallel.py as its plugin.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel import GIVEN_CORES, require_every_core

REPO = Path(__file__).resolve().parent.parent.parent
CORES = GIVEN_CORES  # this run's, before an xdist worker running these tests pinned itself

PROBES = """
import json, os, time
from pathlib import Path

import pytest


def _record(tmp_path_factory, name):
    out = Path(os.environ["PROBE_OUT"]) / f"{name}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    out.write_text(json.dumps({"cores": sorted(os.sched_getaffinity(0)),
                               "worker": os.environ.get("PYTEST_XDIST_WORKER")}))


@pytest.fixture(scope="module")
def built_once(tmp_path_factory):
    return 1


@pytest.mark.parametrize("n", range(8))
def test_spread(n, tmp_path_factory):
    _record(tmp_path_factory, f"spread{n}")


@pytest.mark.parametrize("n", range(4))
def test_grouped(n, built_once, tmp_path_factory):
    time.sleep(0.25)
    _record(tmp_path_factory, f"grouped{n}")


def test_parallel(every_core):
    pass
"""


def _outside_xdist() -> dict[str, str]:
    """This environment as a run started by hand sees it (not this xdist worker's identity)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}


def _every_given_core() -> None:
    """The child run gets the cores this run was given, not this worker's pinned share."""
    if CORES and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, CORES)


def _run(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, dict]]:
    (tmp_path / "test_probes.py").write_text(PROBES)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "tests.parallel", "-p", "no:cacheprovider"),
            *("-q", "--rootdir", str(tmp_path), "-W", "ignore::pytest.PytestUnknownMarkWarning"),
            *(str(tmp_path / "test_probes.py"), *args),
        ],
        cwd=REPO,
        env={**_outside_xdist(), "PROBE_OUT": str(out), "PYTHONPATH": str(REPO)},
        preexec_fn=_every_given_core,
        capture_output=True,
        text=True,
        timeout=240,
    )
    records = {p.name: json.loads(p.read_text()) for p in out.iterdir()}
    return done.returncode, done.stdout + done.stderr, records


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores to give each worker its own")
def test_workers_are_pinned_apart_and_module_fixtures_keep_their_tests_together(
    tmp_path: Path,
) -> None:
    code, output, records = _run(tmp_path, "-n", "2", "--dist", "loadgroup", "-m", "not every_core")
    assert code == 0, output
    per_worker = {r["worker"]: r["cores"] for r in records.values()}
    assert sorted(per_worker) == ["gw0", "gw1"]
    assert all(len(cores) == len(CORES) // 2 for cores in per_worker.values())
    assert not set(per_worker["gw0"]) & set(per_worker["gw1"])
    grouped = {r["worker"] for name, r in records.items() if name.startswith("grouped")}
    assert len(grouped) == 1  # one worker builds the module fixture and runs all four
    # The controller's summary says how the work split: each worker's time and idle tail.
    balance = re.findall(r"gw(\d) ([\d.]+) s in tests, idle for the last ([\d.]+) s", output)
    assert sorted(w for w, _, _ in balance) == ["0", "1"], output
    assert sum(float(busy) for _, busy, _ in balance) >= 1.0, output  # four grouped 0.25 s
    assert min(float(idle) for _, _, idle in balance) == 0, output  # one ran the last test


def test_a_tp_test_is_refused_in_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    with pytest.raises(pytest.fail.Exception, match="this test needs every core: run it without"):
        require_every_core()
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    require_every_core()


def test_a_tp_test_is_marked_and_runs_without_workers(tmp_path: Path) -> None:
    code, output, records = _run(tmp_path, "-m", "every_core")
    assert code == 0 and "1 passed, 12 deselected" in output, output
    assert not records
