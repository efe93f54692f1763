"""eaglequant's ``import quark.torch`` registers the same MoE expert classes as Quark's own scan."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import transformers

from eaglequant.quantize.quark_backend import EXPERTS_DECORATOR

REGISTRY = (
    "from eaglequant.quantize.quark_backend import import_quark\n"
    "import_quark()\n"
    "from quark.torch.utils.llm.module_replacement import PREPROCESS_REGISTRY\n"
    "import json\n"
    "print(json.dumps(sorted(f'{c.__module__}.{c.__name__}' for c in PREPROCESS_REGISTRY)))\n"
)


def _decorated_classes() -> set[str]:
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


def test_quark_registers_every_decorated_experts_class() -> None:
    # A fresh process: this one may have imported Quark already, by another path.
    printed = subprocess.run(
        [sys.executable, "-c", REGISTRY], check=True, capture_output=True, text=True
    ).stdout
    registered = set(json.loads(printed.splitlines()[-1]))
    decorated = _decorated_classes()
    assert len(decorated) >= 40, decorated  # the scan is not vacuous
    assert decorated <= registered, sorted(decorated - registered)
