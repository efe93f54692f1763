"""Where code lives: rooms by concern, a torch-free core, one-way imports between rooms,
keyword-only requests."""

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
    "eaglequant.rules.exclusions",
    "eaglequant.rules.fix_config",
    "eaglequant.rules.draft",
    "eaglequant.rules.target_fit",
    "eaglequant.results.compare_report",
    "eaglequant.progress",
    "eaglequant.results.spec_counts",
    "eaglequant.forms",
    "eaglequant.quantization",
    "eaglequant.rules.vocab_maps",
    "eaglequant.rules.inspection",
    "eaglequant.results.manifest",
    "eaglequant.results.validation_report",
    "eaglequant.results.environment",
    "eaglequant.io.safetensors_header",
    "eaglequant.io.checkpoint",
    "eaglequant.io.layout",
    "eaglequant.io.writer",
    "eaglequant.io.readback",
    "eaglequant.io.output",
    "eaglequant.engine.config",
    "eaglequant.engine.process",
    "eaglequant.results.engine_result",
    "eaglequant.engine.child_request",
    "eaglequant.engine.server",
    "eaglequant.tune.request",
    "eaglequant.tune.choice",
    "eaglequant.tune.baseline_verdicts",
    "eaglequant.tune.metrics",
    "eaglequant.results.tune_summary",
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


def test_the_stages_of_a_file_to_file_export_load_no_transformers() -> None:
    """Beside Quark's worker the export's own process imports torch, not transformers,
    unless a stage holds the draft as a module (``quantize/module_flow.py``)."""
    loaded = _loaded_after("import eaglequant.quantize.export, eaglequant.quantize.pipeline")
    assert "torch" in loaded and "transformers" not in loaded


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


# Rooms by concern: a room is a folder of eaglequant/ (quantize/ and validate/ are rooms too);
# the root's own modules are the room "eaglequant".
LOOSE_LIMIT = 6
# A file name several rooms may use: the same kind of thing in sibling rooms.
SAME_KIND = {
    "base.py": {"forms", "quantization"},  # the interface a variant room's modules implement
    "request.py": {"tune", "validate"},  # a command's keyword-only request and its checks
}


def _room(path: Path) -> str:
    parts = path.relative_to(REPO).parts
    return parts[0] if parts[0] != "eaglequant" or len(parts) == 2 else parts[1]


def test_package_root_holds_few_loose_modules() -> None:
    loose = sorted(p.stem for p in (REPO / "eaglequant").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= LOOSE_LIMIT, f"{len(loose)} loose modules, move some to a room: {loose}"


def test_no_two_modules_share_a_file_name_across_concerns() -> None:
    """Allowed: SAME_KIND, and cli/<command>.py beside the one library module it imports."""
    modules = _modules()
    by_name: dict[str, dict[str, str]] = {}
    for module, path in modules.items():
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, {})[_room(path)] = module
    wrong = []
    for name, rooms in sorted(by_name.items()):
        if len(rooms) < 2 or set(rooms) <= SAME_KIND.get(name, set()):
            continue
        if len(rooms) == 2 and "cli" in rooms:
            command = rooms["cli"]
            (library,) = (m for room, m in rooms.items() if room != "cli")
            if library in _imports(modules[command], command, set(modules)):
                continue
        wrong.append(f"{name}: {sorted(rooms.values())}")
    assert not wrong, "same file name, different concerns (rename one): " + "; ".join(wrong)


def test_no_two_rooms_import_each_other() -> None:
    """Imports inside functions count too."""
    modules = _modules()
    edges: dict[tuple[str, str], tuple[str, str]] = {}
    for module, path in modules.items():
        for target in _imports(path, module, set(modules)):
            pair = (_room(path), _room(modules[target]))
            if pair[0] != pair[1]:
                edges.setdefault(pair, (module, target))
    mutual = sorted(
        f"{a} <-> {b} ({' -> '.join(edges[a, b])}; {' -> '.join(edges[b, a])})"
        for a, b in edges
        if a < b and (b, a) in edges
    )
    assert not mutual, mutual


def test_engine_children_are_named_by_import() -> None:
    """A module that declares ``CHILD = EngineChild(run)`` is started through that name: no
    string in the package names the module."""
    modules = _modules()
    children = set()
    strings: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and [ast.unparse(t) for t in node.targets] == ["CHILD"]
                and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "EngineChild"
            ):
                children.add(module)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.setdefault(node.value, set()).add(module)
    assert {"eaglequant.validate.engine_run", "eaglequant.validate.single_engine"} <= children
    assert "eaglequant.capture.vllm_child" in children
    named = {child: sorted(strings[child]) for child in children if child in strings}
    assert not named, f"engine children named by a string: {named}"


def test_results_and_rules_load_no_torch_click_or_rich() -> None:
    rooms = [m for m in _modules() if m.startswith(("eaglequant.results", "eaglequant.rules"))]
    loaded = _loaded_after("\n".join(f"import {name}" for name in rooms))
    assert not loaded & {"torch", "click", "rich", "transformers", "safetensors"}


# Why an import may stay inside a function; anything else belongs at module level.
LAZY_REASONS = (
    "--help latency",
    "torch-free core",
    "Quark's slow import",
    "vllm is an optional extra",
    "the plots extra",
    "env set before vLLM loads",
)


def test_every_function_local_import_says_why() -> None:
    """A ``# lazy: <reason>`` line above the import, or above the run of imports it ends."""
    unsaid = []
    for path in _modules().values():
        lines = path.read_text().splitlines()
        reasons: dict[int, str | None] = {}  # an import's last line -> its reason
        functions = [
            n
            for n in ast.walk(ast.parse("\n".join(lines)))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        nodes = sorted(
            {
                (n.lineno, n.end_lineno or n.lineno)
                for f in functions
                for n in ast.walk(f)
                if isinstance(n, ast.Import | ast.ImportFrom)
            }
        )
        for first, last in nodes:
            above = lines[first - 2].strip()
            reason = above.removeprefix("# lazy: ") if above.startswith("# lazy: ") else None
            reason = reason or reasons.get(first - 1)
            reasons[last] = reason
            if reason not in LAZY_REASONS:
                unsaid.append(f"{path.relative_to(REPO)}:{first}")
    assert not unsaid, "function-local imports with no reason (or hoist them): " + ", ".join(unsaid)


def test_modules_that_keep_imports_lazy_for_the_torch_free_core_load_no_torch() -> None:
    """The reason must hold: such a module (a command's parent side, a result's reader)
    imports without torch, transformers or vLLM."""
    marked = [
        module
        for module, path in _modules().items()
        if "# lazy: torch-free core" in path.read_text()
    ]
    assert len(marked) > 10
    loaded = _loaded_after("\n".join(f"import {name}" for name in marked))
    assert not loaded & {"torch", "transformers", "vllm", "quark"}
