"""tests/as_avx2: any Python process started with it answers torch's CPU probes as an AVX2 CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "as_avx2"
PROBE = """
import json, sys
before = "torch" in sys.modules
import torch
print(json.dumps({"torch_at_start": before, "avx512": torch.cpu._is_avx512_supported(),
    "bf16": torch.cpu._is_avx512_bf16_supported(), "amx": torch.cpu._is_amx_tile_supported()}))
"""


def test_a_child_sees_an_avx2_cpu_and_torch_is_not_imported_for_it() -> None:
    env = {**os.environ, "PYTHONPATH": str(FOLDER)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == {
        "torch_at_start": False,
        "avx512": False,
        "bf16": False,
        "amx": False,
    }
