"""mypy sees quantize/ and validate/ under their installed names: a planted error is found."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PLANTED = """

def _planted() -> int:
    from eaglequant.validate.check import Check

    return Check("x", True, "d").passed + Check("x", True, "d").name
"""


def test_an_error_planted_in_quantize_is_reported(tmp_path: Path) -> None:
    tree = tmp_path / "typecheck"
    subprocess.run(["make", "-s", "typecheck-tree", f"TYPECHECK={tree}"], cwd=REPO, check=True)
    package = tree / "eaglequant"
    (package / "quantize").unlink()
    shutil.copytree(REPO / "quantize", package / "quantize")
    with (package / "quantize" / "timing.py").open("a", encoding="utf-8") as handle:
        handle.write(PLANTED)
    mypy = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")]
    done = subprocess.run(
        [*mypy, "--cache-dir", str(tmp_path / "cache"), "eaglequant"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "eaglequant/quantize/timing.py" in done.stdout
    assert 'Unsupported operand types for + ("bool" and "str")' in done.stdout
