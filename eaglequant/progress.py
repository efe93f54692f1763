"""How a long command reports its stages: one line at a time, to whoever asked (the CLI
prints them to stderr; a library caller may log them or drop them)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str], None]


def quiet(_message: str) -> None:
    """The default: report nothing."""
