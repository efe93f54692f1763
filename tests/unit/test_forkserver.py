"""The fork server: a forked child behaves as ``python -m module`` started by Popen would."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from eaglequant.engine.forkserver import FORKSERVER_ENV, ForkedChild, process_name, server_for
from eaglequant.engine.process import kill_group, run_child, start_child

REPORTER = """
import json, os, sys
PRELOAD = ("fsprobe_heavy",)
if __name__ == "__main__":
    print("to the log")
    out = {"argv": sys.argv[1:], "cwd": os.getcwd(), "main": __name__, "pid": os.getpid(),
           "sid": os.getsid(0), "affinity": sorted(os.sched_getaffinity(0)),
           "heavy_loaded": "fsprobe_heavy" in sys.modules,
           "test": os.environ.get("PYTEST_CURRENT_TEST"),
           "comm": open("/proc/self/comm").read().strip()}
    with open(sys.argv[1], "w") as handle:
        json.dump(out, handle)
    sys.exit(int(sys.argv[2]))
"""
HEAVY = """
import os
with open(os.environ["FSPROBE_IMPORTS"], "a") as handle:
    handle.write("imported\\n")
"""
FAILING = """
if __name__ == "__main__":
    raise ValueError("planted failure")
"""
SLEEPER = """
import time
if __name__ == "__main__":
    print("sleeping", flush=True)
    time.sleep(600)
"""
THREADED = """
import threading, time
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
if __name__ == "__main__":
    print("ran as a plain subprocess")
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    modules = tmp_path / "modules"
    modules.mkdir()
    for name, text in [
        ("fsprobe_reporter", REPORTER),
        ("fsprobe_heavy", HEAVY),
        ("fsprobe_failing", FAILING),
        ("fsprobe_sleeper", SLEEPER),
        ("fsprobe_threaded", THREADED),
    ]:
        (modules / f"{name}.py").write_text(text)
    pythonpath = os.pathsep.join([str(modules), *sys.path])
    imports = str(tmp_path / "imports.txt")
    return dict(os.environ, PYTHONPATH=pythonpath, FSPROBE_IMPORTS=imports, **{FORKSERVER_ENV: "1"})


def argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def test_a_forked_child_runs_as_main_in_its_own_session_with_the_callers_cwd(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out, log = tmp_path / "out.json", tmp_path / "child.log"
    env["PYTEST_CURRENT_TEST"] = "first"
    child = start_child(argv("fsprobe_reporter", str(out), "3"), log, env)
    assert isinstance(child, ForkedChild)
    assert child.wait(timeout=60) == 3
    seen = json.loads(out.read_text())
    assert seen["argv"] == [str(out), "3"]
    assert seen["main"] == "__main__" and seen["pid"] == child.pid == seen["sid"]
    assert seen["cwd"] == str(work)
    assert seen["comm"] == process_name("fsprobe_reporter") == "fsprobe_reporte"
    assert seen["affinity"] == sorted(os.sched_getaffinity(0))
    assert log.read_text() == "to the log\n"
    assert seen["heavy_loaded"] and seen["test"] == "first"
    # the second child forks from the same server (pytest's per-test variable is not part of its
    # key, the child still gets its own value): what the module preloads is imported once
    env["PYTEST_CURRENT_TEST"] = "second"
    again = start_child(argv("fsprobe_reporter", str(out), "0"), log, env)
    assert isinstance(again, ForkedChild) and again.server is child.server
    assert again.wait(timeout=60) == 0
    assert json.loads(out.read_text())["test"] == "second"
    assert Path(env["FSPROBE_IMPORTS"]).read_text() == "imported\n"


def test_an_exception_is_exit_1_with_its_traceback_in_the_log(
    env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "child.log"
    ended = run_child(argv("fsprobe_failing"), log, env, timeout=60)
    assert ended.returncode == 1 and not ended.ok
    assert "ValueError: planted failure" in log.read_text()


def test_a_timeout_kills_the_childs_group(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    ended = run_child(argv("fsprobe_sleeper"), log, env, timeout=1)
    assert ended.timed_out and ended.cause() == "timed out"
    assert ended.returncode == -9


def test_a_killed_child_reports_its_signal(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = start_child(argv("fsprobe_sleeper"), log, env)
    assert isinstance(child, ForkedChild)
    deadline = time.monotonic() + 60
    while "sleeping" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.poll() is None
    kill_group(child)
    assert child.wait(timeout=60) == -9


def test_a_module_that_starts_a_thread_runs_as_a_plain_subprocess(
    env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "child.log"
    refused = server_for(sys.executable, env).start("fsprobe_threaded", [], log, env)
    assert refused == "importing fsprobe_threaded started a thread"
    ended = run_child(argv("fsprobe_threaded"), log, env, timeout=60)
    assert ended.ok and log.read_text() == "ran as a plain subprocess\n"


def test_without_the_variable_children_are_plain_subprocesses(
    env: dict[str, str], tmp_path: Path
) -> None:
    del env[FORKSERVER_ENV]
    out, log = tmp_path / "out.json", tmp_path / "child.log"
    child = start_child(argv("fsprobe_reporter", str(out), "0"), log, env)
    assert not isinstance(child, ForkedChild)
    assert child.wait(timeout=60) == 0
