"""eaglequant's ``import quark.torch`` skips Quark's expert-class scan, and nothing it hands
Quark could hold one of the classes that scan registers; Quark's loggers start at WARNING
unless the user's ``QUARK_LOG_LEVEL`` says otherwise."""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from transformers import LlamaConfig

from eaglequant.model.eagle3 import Eagle3Draft
from eaglequant.quantize.quark_backend import EXPERTS_DECORATOR
from eaglequant_examples.synthetic import draft_config
from tests.conftest import MLA

REGISTRY = (
    "import sys, json\n"
    "from eaglequant.quantize.quark_backend import import_quark\n"
    "import_quark()\n"
    "from quark.common.utils.log import ScreenLogger\n"
    "from quark.torch.utils.llm.module_replacement import PREPROCESS_REGISTRY\n"
    "print(json.dumps({'registered': sorted(f'{c.__module__}.{c.__name__}' "
    "for c in PREPROCESS_REGISTRY), 'modules': sorted(sys.modules), "
    "'levels': [i.logger.level for i in ScreenLogger._instances]}))\n"
)


def _import(env: dict[str, str]) -> tuple[dict[str, list[str]], str]:
    done = subprocess.run(
        [sys.executable, "-c", REGISTRY], check=True, capture_output=True, text=True, env=env
    )
    lines = done.stdout.splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1]) + done.stderr


@pytest.fixture(scope="module")
def decorated() -> set[str]:
    """Every transformers class decorated with the experts decorator, found by parsing every
    modeling file in full (what Quark's own scan does, independently of eaglequant)."""
    root = Path(transformers.__file__).parent
    found = set()
    for path in (root / "models").rglob("modeling_*.py"):
        module = "transformers." + ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(d, ast.Name) and d.id == EXPERTS_DECORATOR)
                or (isinstance(d, ast.Call) and getattr(d.func, "id", None) == EXPERTS_DECORATOR)
                for d in node.decorator_list
            ):
                found.add(f"{module}.{node.name}")
    return found


def _without_quark_level() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "QUARK_LOG_LEVEL"}


@pytest.fixture(scope="module")
def quark_import() -> tuple[dict[str, list[str]], str]:
    # A fresh process: this one may have imported Quark already, by another path.
    return _import(_without_quark_level())


@pytest.fixture(scope="module")
def imported(quark_import: tuple[dict[str, list[str]], str]) -> dict[str, list[str]]:
    return quark_import[0]


def test_quarks_loggers_start_at_warning_unless_the_user_sets_its_level(
    quark_import: tuple[dict[str, list[str]], str],
) -> None:
    imported, said = quark_import
    assert len(imported["levels"]) >= 50  # every logger Quark's import made
    assert set(imported["levels"]) == {logging.WARNING} and "[QUARK-INFO]" not in said
    found, said = _import(_without_quark_level() | {"QUARK_LOG_LEVEL": "info"})
    assert set(found["levels"]) == {logging.INFO} and "[QUARK-INFO]" in said


def test_the_scan_imports_and_registers_none_of_the_decorated_classes(
    imported: dict[str, list[str]], decorated: set[str]
) -> None:
    assert len(decorated) >= 40, decorated  # the scan would have work to do
    modules = {name.rsplit(".", 1)[0] for name in decorated}
    loaded = modules & set(imported["modules"])
    registered = decorated & set(imported["registered"])
    # Quark registers a few classes by name, importing their modules; the scan, run, would
    # import every one of these modules and register every decorated class.
    assert len(loaded) < len(modules) / 4, sorted(loaded)
    assert len(registered) < len(decorated) / 4, sorted(registered)


@pytest.mark.parametrize("form", [{}, MLA], ids=["llama", "mla"])
def test_no_draft_form_holds_a_class_quark_replaces(
    imported: dict[str, list[str]], decorated: set[str], form: dict[str, object]
) -> None:
    with torch.device("meta"):
        draft = Eagle3Draft(LlamaConfig(**(draft_config() | form)))
    classes = {f"{type(m).__module__}.{type(m).__name__}" for m in draft.modules()}
    replaced = decorated | set(imported["registered"])
    assert not classes & replaced
    assert all(name.startswith(("eaglequant.", "torch.nn.")) for name in classes), classes
