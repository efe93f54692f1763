"""The suite's parallel pass, as a pytest plugin (torch-free; tests/conftest.py takes its hooks).

``pytest -n N``: each xdist worker runs on its own share of the cores; a test that uses a
module-scoped fixture joins its module's xdist group (``--dist loadgroup``), so the fixture is
built once; a test that uses ``every_core`` (tensor and data parallel engines) is marked so and
refused in a worker: ``make test`` runs those in a serial pass with every core.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

EVERY_CORE = "every_core"  # the fixture, and the marker of the tests that use it
# The cores this run was given, before an xdist worker pins itself to its share.
GIVEN_CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
# The controller's view of each xdist worker: [seconds in tests, when its last test ended].
WORKER_TIMES: dict[str, list[float]] = {}


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker runs on its own share of the cores, and so do the engines and servers it
    starts (vLLM binds a CPU worker's threads to the cores it may use): N workers side by side,
    none taking another's cores, so a test that times its engines has its share to itself."""
    worker, count = (
        os.environ.get("PYTEST_XDIST_WORKER"),
        os.environ.get("PYTEST_XDIST_WORKER_COUNT"),
    )
    if worker is None or count is None or not hasattr(os, "sched_setaffinity"):
        return
    per = len(GIVEN_CORES) // int(count)
    if per >= 1:
        index = int(worker.removeprefix("gw"))
        mine = GIVEN_CORES[index * per : (index + 1) * per]
        os.sched_setaffinity(0, mine)
        torch = sys.modules.get("torch")  # sized at import: a later import sees the pin
        if torch is not None:
            torch.set_num_threads(len(mine))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marked as collected, before any plugin reorders or groups the items."""
    if EVERY_CORE in getattr(item, "fixturenames", ()):
        item.add_marker(getattr(pytest.mark, EVERY_CORE))
    if _uses_module_fixture(item):
        item.add_marker(pytest.mark.xdist_group(Path(str(item.fspath)).stem))


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope == "module" for defs in definitions for d in defs)


@pytest.fixture(scope="session")
def every_core() -> None:
    """For tests whose engines need a core per worker (tensor and data parallel): ``make
    test`` runs them in a serial pass after the parallel one, with every core."""
    require_every_core()


def require_every_core() -> None:
    """Fails in an xdist worker, which is pinned to its share of the cores."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        pytest.fail("this test needs every core: run it without -n (make test-rest does)")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the xdist controller: add each phase (setup, call, teardown) to its worker's times."""
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
    if worker is None:
        return
    times = WORKER_TIMES.setdefault(worker, [0.0, report.stop])
    times[0] += report.duration
    times[1] = max(times[1], report.stop)


def worker_balance() -> str | None:
    """One line for the terminal summary: each worker's seconds in tests and how long before
    the pass's last test it ran out of work (the time a better split could save)."""
    if not WORKER_TIMES:
        return None
    last = max(times[1] for times in WORKER_TIMES.values())
    return "workers: " + "; ".join(
        f"{worker} {times[0]:.1f} s in tests, idle for the last {last - times[1]:.1f} s"
        for worker, times in sorted(WORKER_TIMES.items())
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The worker balance line, after a parallel pass (tests/conftest.py's summary calls it)."""
    line = worker_balance()
    if line:
        terminalreporter.write_line(line)
