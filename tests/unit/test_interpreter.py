"""Heavy imports with the garbage collector paused (paused inside, as it was after), and the
exit that skips the interpreter's teardown."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from eaglequant.interpreter import collection_paused, import_all


@pytest.fixture
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


@pytest.mark.usefixtures("collector_restored")
def test_paused_inside_and_running_again_after_also_when_the_block_raises() -> None:
    gc.enable()
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError), collection_paused():
        assert not gc.isenabled()
        _ = 1 / 0
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_restored")
def test_a_caller_that_had_it_off_keeps_it_off() -> None:
    gc.disable()
    with collection_paused():
        pass
    assert not gc.isenabled()


@pytest.mark.usefixtures("collector_restored")
def test_import_all_imports_each_module_and_resumes_the_collector() -> None:
    gc.enable()
    sys.modules.pop("colorsys", None)
    import_all(["colorsys"])
    assert "colorsys" in sys.modules and gc.isenabled()
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        import_all(["no_such_module_here"])
    assert gc.isenabled()


def test_exit_at_once_flushes_the_streams_and_skips_atexit() -> None:
    script = (
        "import atexit, sys\n"
        "from eaglequant.interpreter import exit_at_once\n"
        "atexit.register(lambda: print('teardown'))\n"
        "sys.stdout.write('result on disk')\n"  # no newline: still in the buffer
        "exit_at_once(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (3, "result on disk")


@pytest.mark.parametrize(
    ("args", "code", "torn_down"),
    [
        (["export", "draft", "--dump-recipe", "--recipe", "ptpc-fp8"], 0, False),  # succeeded
        (["export", "no-such-draft", "out"], 2, True),  # export refused: the usual exit
        (["inspect", "--help"], 0, True),  # not a command that ends at once
    ],
)
def test_the_script_skips_teardown_only_after_a_successful_export(
    args: list[str], code: int, torn_down: bool
) -> None:
    script = (
        "import atexit, sys\n"
        "from eaglequant.cli import run\n"
        "atexit.register(lambda: print('teardown'))\n"
        f"sys.argv = ['eaglequant', *{args!r}]\n"
        "run()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == code, done.stderr
    assert done.stdout.endswith("teardown\n") == torn_down
    said = done.stdout.removesuffix("teardown\n") + done.stderr  # what the command printed
    assert said.startswith("error: " if code else ("name: ptpc-fp8" if not torn_down else "Usage"))


def test_an_export_run_in_process_earlier_does_not_end_a_later_run_at_once() -> None:
    script = (
        "import atexit, sys\n"
        "from click.testing import CliRunner\n"
        "from eaglequant.cli import main, run\n"
        "atexit.register(lambda: print('teardown'))\n"
        "assert CliRunner().invoke(main, ['export', 'draft', '--dump-recipe']).exit_code == 0\n"
        "sys.argv = ['eaglequant', 'inspect', '--help']\n"
        "run()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage") and done.stdout.endswith("teardown\n")
