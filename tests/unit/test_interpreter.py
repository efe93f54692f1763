"""Heavy imports with the garbage collector paused (paused inside, as it was after, what they
left alive frozen out of later collections until exit), and the exit that skips the
interpreter's teardown."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from eaglequant.interpreter import collection_paused, import_all


def _python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)


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
    frozen = gc.get_freeze_count()
    with collection_paused():
        kept = [[index] for index in range(1000)]
    assert not gc.isenabled()
    assert gc.get_freeze_count() == frozen  # the caller's own block freezes, when it ends
    assert len(kept) == 1000


@pytest.mark.usefixtures("collector_restored")
def test_what_the_block_left_alive_is_frozen_out_of_later_collections() -> None:
    gc.enable()
    frozen = gc.get_freeze_count()
    with collection_paused():
        kept = [[index] for index in range(1000)]
    assert gc.get_freeze_count() >= frozen + len(kept)
    tracked = {id(obj) for obj in gc.get_objects()}  # what a collection would walk
    assert not tracked & {id(obj) for obj in kept}
    gc.unfreeze()


def test_frozen_objects_are_unfrozen_at_exit_for_the_teardown() -> None:
    script = (
        "import atexit, gc\n"
        "from eaglequant.interpreter import collection_paused\n"
        # registered first, so it runs after the handlers registered later
        "atexit.register(lambda: print('frozen at exit', gc.get_freeze_count()))\n"
        "with collection_paused():\n"
        "    kept = [[index] for index in range(1000)]\n"
        "print('frozen', gc.get_freeze_count() >= 1000)\n"
    )
    done = _python(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "frozen True\nfrozen at exit 0\n"


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
    done = _python(script)
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
    done = _python(script)
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
    done = _python(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage") and done.stdout.endswith("teardown\n")
