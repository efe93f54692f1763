"""Every EAGLEQUANT_* variable the code reads or sets is in docs/cli.md's table, and the table
lists no other."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("eaglequant", "quantize", "validate", "configs", "examples/eaglequant_examples", "tests")
NAME = re.compile(r"\bEAGLEQUANT_[A-Z0-9_]+")


def test_every_environment_variable_is_documented_once() -> None:
    used = {
        name
        for folder in SOURCES
        for path in (ROOT / folder).rglob("*.py")
        for name in re.findall(r"\"(EAGLEQUANT_[A-Z0-9_]*[A-Z0-9])\"", path.read_text())
    }
    text = (ROOT / "docs" / "cli.md").read_text().split("## Environment variables", 1)[1]
    rows = [NAME.match(line.split("`")[1]) for line in text.splitlines() if line.startswith("| `")]
    documented = [row.group() for row in rows if row]
    assert len(documented) == len(set(documented))
    assert set(documented) == used, (
        f"undocumented {used - set(documented)}, gone {set(documented) - used}"
    )
