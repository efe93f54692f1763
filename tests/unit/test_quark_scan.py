"""The wrapper around Quark's expert-class scan: that scan parses nothing, others are untouched."""

from __future__ import annotations

import ast

import pytest

from eaglequant.quantize.quark_backend import EXPERTS_DECORATOR, experts_scan_skipped

MARKED = f"@{EXPERTS_DECORATOR}\nclass Experts:\n    pass\n"
UNMARKED = "class Attention:\n    pass\n"


def _find_decorated_experts_classes(source: str) -> ast.Module:  # named as Quark's scan
    return ast.parse(source)


def _another_caller(source: str) -> ast.Module:
    return ast.parse(source)


def test_the_scan_parses_nothing_and_other_callers_parse_as_before() -> None:
    with experts_scan_skipped():
        assert _find_decorated_experts_classes(UNMARKED).body == []
        assert _find_decorated_experts_classes(MARKED).body == []
        other = _another_caller(MARKED).body
    assert [n.name for n in other if isinstance(n, ast.ClassDef)] == ["Experts"]
    assert _find_decorated_experts_classes(MARKED).body  # ast.parse is itself again


def test_ast_parse_is_restored_when_the_import_fails() -> None:
    original = ast.parse
    with pytest.raises(ImportError), experts_scan_skipped():
        raise ImportError("quark")
    assert ast.parse is original
