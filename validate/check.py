"""One validation check's outcome, shared by every check module of ``validate``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eaglequant.validate.stats import FAIL, PASS, VERDICTS


@dataclass
class Check:
    """``verdict`` is PASS, FAIL or INCONCLUSIVE (a pass/fail check: PASS or FAIL from
    ``passed``); ``passed`` is true for PASS alone."""

    name: str
    passed: bool
    detail: str
    numbers: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""

    def __post_init__(self) -> None:
        if not self.verdict:
            self.verdict = PASS if self.passed else FAIL
        if self.verdict not in VERDICTS or self.passed != (self.verdict == PASS):
            raise ValueError(
                f"check {self.name}: verdict {self.verdict!r} with passed={self.passed}"
            )

    @classmethod
    def judged(
        cls, name: str, verdict: str, detail: str, numbers: dict[str, Any] | None = None
    ) -> Check:
        """A check whose verdict comes from :func:`eaglequant.validate.stats.judge`."""
        return cls(name, verdict == PASS, detail, numbers or {}, verdict)
