"""The export manifest records how export was run, with every path a placeholder."""

from __future__ import annotations

import json
from pathlib import Path

from eaglequant.results.provenance import machine_paths


def test_the_manifest_records_the_export_command_path_free(toy_fp8: Path) -> None:
    manifest = json.loads((toy_fp8 / "eaglequant.json").read_text())
    assert manifest["command"] == (
        "eaglequant export <BF16_DRAFT> <FP8_DRAFT> --calib-target <TARGET> "
        "--calib-data <CALIB_DATA>"
    )
    assert machine_paths(manifest["command"]) == []
