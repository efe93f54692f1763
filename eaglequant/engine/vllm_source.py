"""The installed vLLM's sources, read without importing them.

:mod:`eaglequant.engine.vllm_internals` asks :func:`defines` whether each of its hooks is
still where it was read. Reading, not importing, keeps the probe cheap (no torch, no vLLM
initialisation) and lets it check Model Runner V2's modules on machines that cannot run them.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path


def defines(owner: str, member: str, params: tuple[str, ...] | None = None) -> bool:
    """Whether ``owner`` (``module`` or ``module:Class``) defines ``member`` as read: a
    function, class, method (its leading parameters ``params``), an attribute the class
    assigns, or, for a module, an attribute assigned on any object in it."""
    module, _, cls = owner.partition(":")
    tree = _source(module)
    if tree is None:
        return False
    if not cls:
        return member in _module_names(tree) or member in _stored_attributes(tree)
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    if node is None:
        return False
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == member:
            return _params_match(item, params)
        if member in _targets(item):
            return params is None
    return params is None and member in _stored_attributes(node)


def _params_match(
    node: ast.FunctionDef | ast.AsyncFunctionDef, params: tuple[str, ...] | None
) -> bool:
    if params is None:
        return True
    args = node.args
    names = [a.arg for a in [*args.posonlyargs, *args.args][1:] + args.kwonlyargs]
    return names[: len(params)] == list(params)


@functools.cache
def _source(module: str) -> ast.Module | None:
    """The module's parsed source, found under the installed vLLM without importing it."""
    spec = importlib.util.find_spec("vllm")  # a top-level lookup imports nothing
    if spec is None or not spec.origin:
        return None
    base = Path(spec.origin).parent.parent / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return ast.parse(path.read_text(encoding="utf-8"))
    return None


def _targets(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _module_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        names |= _targets(node)
    return names


def _stored_attributes(tree: ast.AST) -> set[str]:
    """Attribute names assigned anywhere below ``tree`` (``x.name = …``, ``x.name: T = …``)."""
    found = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            found |= {t.attr for t in targets if isinstance(t, ast.Attribute)}
    return found
