"""The prefilter around Quark's expert-class scan: only that scan's unmarked files are skipped."""

from __future__ import annotations

import ast

import pytest

from eaglequant.quantize.quark_backend import (
    EXPERTS_DECORATOR,
    experts_scan_parses_marked_files_only,
)

MARKED = f"@{EXPERTS_DECORATOR}\nclass Experts:\n    pass\n"
UNMARKED = "class Attention:\n    pass\n"


def _find_decorated_experts_classes(source: str) -> ast.Module:  # named as Quark's scan
    return ast.parse(source)


def _another_caller(source: str) -> ast.Module:
    return ast.parse(source)


def test_only_the_scans_unmarked_files_are_skipped() -> None:
    with experts_scan_parses_marked_files_only():
        assert _find_decorated_experts_classes(UNMARKED).body == []
        marked = _find_decorated_experts_classes(MARKED).body
        other = _another_caller(UNMARKED).body
    assert [type(n) for n in marked] == [ast.ClassDef] and marked[0].decorator_list
    assert [n.name for n in other if isinstance(n, ast.ClassDef)] == ["Attention"]
    assert _find_decorated_experts_classes(UNMARKED).body  # ast.parse is itself again


def test_ast_parse_is_restored_when_the_import_fails() -> None:
    original = ast.parse
    with pytest.raises(ImportError), experts_scan_parses_marked_files_only():
        raise ImportError("quark")
    assert ast.parse is original
