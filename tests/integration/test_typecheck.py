"""mypy sees quantize/ and validate/ under their installed names: a planted error is found."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO

LINT_CACHE = "build/typecheck/.mypy_cache"  # where make lint's mypy keeps its cache

PLANTED = """

def _planted() -> int:
    from eaglequant.results.validation_report import Check, CheckId

    return Check(CheckId.LAYERS, True, "d").passed + Check(CheckId.LAYERS, True, "d").detail
"""


def test_an_error_planted_in_quantize_is_reported(tmp_path: Path) -> None:
    """``make typecheck`` (lint's mypy, in the unit venv) on a tree with the error planted.
    With lint's cache copied beside it, mypy checks again only the planted module and what
    depends on it."""
    tree = tmp_path / "typecheck"
    subprocess.run(["make", "-s", "typecheck-tree", f"TYPECHECK={tree}"], cwd=REPO, check=True)
    package = tree / "eaglequant"
    (package / "quantize").unlink()
    shutil.copytree(REPO / "quantize", package / "quantize")
    with (package / "quantize" / "timing.py").open("a", encoding="utf-8") as handle:
        handle.write(PLANTED)
    if (REPO / LINT_CACHE).is_dir():
        shutil.copytree(REPO / LINT_CACHE, tree / ".mypy_cache")  # copy2: mtimes kept
    done = subprocess.run(
        ["make", "-s", "typecheck", f"TYPECHECK={tree}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0, done.stdout + done.stderr
    assert "eaglequant/quantize/timing.py" in done.stdout
    assert 'Unsupported operand types for + ("bool" and "str")' in done.stdout
