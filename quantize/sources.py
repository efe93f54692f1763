"""Where the export's calibration inputs come from (light: read before torch is imported)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from eaglequant.capture.run import CaptureEngine
    from eaglequant.prompts.source import PromptSource


@dataclass(frozen=True, kw_only=True)
class CalibrationSource:
    """A target + data, a capture folder, or none (the recipe's fixed input range)."""

    kind: Literal["target", "capture", "none"]
    target: Path | None = None
    data: Path | PromptSource | None = None  # a text file or a named prompt set
    capture: Path | None = None
    samples: int | None = None
    seq_len: int | None = None
    engine: CaptureEngine | None = None

    def describe(self) -> str:
        if self.kind == "target":
            engine = self.engine.name if self.engine else "?"
            return f"target {self.target} on {self.data} ({engine})"
        if self.kind == "capture":
            return f"captured hidden states {self.capture}"
        return "none (fixed input range from the recipe; scales NOT calibrated)"
