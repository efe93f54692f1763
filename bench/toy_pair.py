"""What the benches share about the toy pair: where it is, and its static FP8 export."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOY = Path(__file__).resolve().parent.parent / "examples" / "toy"


def export_fp8(out: Path) -> Path:
    """The toy draft exported with the default recipe, calibrated on the toy target."""
    eaglequant = Path(sys.executable).parent / "eaglequant"
    args = [str(eaglequant), "export", str(TOY / "draft"), str(out)]
    args += ["--calib-target", str(TOY / "target"), "--calib-data", str(TOY / "calibration.jsonl")]
    subprocess.run(args, check=True, capture_output=True)
    return out
