"""Where the export's calibration inputs come from (light: read before torch is imported)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class CalibrationSource:
    """A target + data, a capture folder, or none (the recipe's fixed input range)."""

    kind: Literal["target", "capture", "none"]
    target: Path | None = None
    data: Path | None = None
    capture: Path | None = None
    samples: int | None = None
    seq_len: int | None = None
    trust_remote_code: bool = False

    def describe(self) -> str:
        if self.kind == "target":
            return f"target {self.target} on {self.data}"
        if self.kind == "capture":
            return f"captured hidden states {self.capture}"
        return "none (fixed input range from the recipe; scales NOT calibrated)"
