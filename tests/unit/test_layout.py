"""Where code lives: a torch-free core, one-way imports, keyword-only requests."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# Folder -> the package name it is installed as (pyproject's package-dir).
ROOTS = {
    "eaglequant": "eaglequant",
    "quantize": "eaglequant.quantize",
    "validate": "eaglequant.validate",
}
CORE = [
    "eaglequant.errors",
    "eaglequant.recipe",
    "eaglequant.exclusions",
    "eaglequant.fix_config",
    "eaglequant.draft",
    "eaglequant.target_fit",
    "eaglequant.compare_report",
    "eaglequant.progress",
    "eaglequant.spec_counts",
    "eaglequant.forms",
    "eaglequant.quantization",
    "eaglequant.vocab_maps",
    "eaglequant.inspection",
    "eaglequant.manifest",
    "eaglequant.validation_report",
    "eaglequant.environment",
    "eaglequant.io.safetensors_header",
    "eaglequant.io.checkpoint",
    "eaglequant.io.layout",
    "eaglequant.io.writer",
    "eaglequant.io.readback",
    "eaglequant.io.output",
    "eaglequant.engine.config",
    "eaglequant.engine.process",
    "eaglequant.engine.result",
    "eaglequant.engine.request",
    "eaglequant.engine.server",
    "eaglequant.tune.request",
    "eaglequant.tune.choice",
    "eaglequant.tune.compare",
    "eaglequant.tune.metrics",
    "eaglequant.tune.summary",
    "eaglequant.capture.run",
    "eaglequant.capture.store",
]
# Modules of eaglequant/ that may import eaglequant.quantize / eaglequant.validate.
MAY_DISPATCH = (
    "eaglequant.cli.",
    "eaglequant.model.",
)


def _loaded_after(imports: str) -> set[str]:
    code = f"import sys\n{imports}\nprint(' '.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return {name.split(".")[0] for name in result.stdout.split()}


def test_package_io_and_cli_load_no_torch() -> None:
    loaded = _loaded_after("import eaglequant, eaglequant.io, eaglequant.cli")
    assert "torch" not in loaded


def test_core_modules_load_no_torch_click_or_rich() -> None:
    loaded = _loaded_after("\n".join(f"import {name}" for name in CORE))
    assert not loaded & {"torch", "click", "rich", "transformers", "safetensors"}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at module level and inside functions alike."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        else:
            found += _import_nodes(node)
    return found


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports (``from a import b``: a, and a.b when a module)."""
    names = set()
    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:  # relative: resolve against this module's package
            base = ".".join([*module.split(".")[: -node.level], *filter(None, [base])])
        names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return (names & modules) - {module}


def test_no_import_cycle_among_project_modules() -> None:
    """Imports inside functions count too: a lazy back-import is still a cycle of concerns."""
    modules = _modules()
    graph = {m: _imports(p, m, set(modules)) for m, p in modules.items()}
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycle = [*path[path.index(target) :], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_core_never_imports_quantize_or_validate() -> None:
    wrong = set()
    modules = _modules()
    for module, path in modules.items():
        if not module.startswith("eaglequant.") or module.startswith(
            ("eaglequant.quantize", "eaglequant.validate", *MAY_DISPATCH)
        ):
            continue
        for target in _imports(path, module, set(modules)):
            if target.startswith(("eaglequant.quantize", "eaglequant.validate")):
                wrong.add((module, target))
    assert not wrong, sorted(wrong)


def test_export_and_capture_requests_are_keyword_only() -> None:
    from eaglequant.capture.run import CaptureEngine, CaptureRequest
    from eaglequant.quantize.export import ExportRequest
    from eaglequant.quantize.sources import CalibrationSource

    for request in (ExportRequest, CalibrationSource, CaptureRequest, CaptureEngine):
        assert all(f.kw_only for f in dataclasses.fields(request)), request
        with pytest.raises(TypeError):
            request(Path("a"))


def test_test_files_have_unique_names_across_tiers() -> None:
    """pytest imports test modules by basename: a name in two tier folders breaks collection."""
    names = [p.name for p in (REPO / "tests").glob("*/test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
