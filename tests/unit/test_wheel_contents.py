"""The wheel ships the tool: every package of the tool, nothing of the example pairs, and no
dependency that only the examples or the plots need (read from pyproject.toml)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_ONLY = ("gguf", "accelerate")  # the GGUF conversion and the draft trainer
EXTRA_ONLY = {"matplotlib": "plots"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def test_every_package_of_the_tool_is_in_the_wheel_and_nothing_else() -> None:
    setuptools = _project()["tool"]["setuptools"]
    folders = setuptools["package-dir"]
    listed = set(setuptools["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "eaglequant").rglob("__init__.py")
    }
    found |= {name for name, folder in folders.items() if (ROOT / folder / "__init__.py").is_file()}
    assert listed == found, f"not shipped: {sorted(found - listed)}; gone: {sorted(listed - found)}"


def test_installing_eaglequant_pulls_no_example_or_plot_dependency() -> None:
    project = _project()["project"]
    names = {_name(r) for r in project["dependencies"]}
    assert not names & {*EXAMPLES_ONLY, *EXTRA_ONLY}, names
    for name, extra in EXTRA_ONLY.items():
        assert name in {_name(r) for r in project["optional-dependencies"][extra]}
    examples = tomllib.loads((ROOT / "examples" / "pyproject.toml").read_text())["project"]
    assert {*EXAMPLES_ONLY, "eaglequant"} <= {_name(r) for r in examples["dependencies"]}
