"""One validation check's outcome, shared by every check module of ``validate``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Check:
    name: str
    passed: bool
    detail: str
    numbers: dict[str, Any] = field(default_factory=dict)
