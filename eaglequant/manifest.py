"""The export manifest (``eaglequant.json``): its name, its fields, its writer and its reader.

``eaglequant export`` writes it beside the weights: tool and library versions,
the recipe, where the calibration came from, per-layer scales and SQNR,
top-1 agreement by speculative step, stage timings and the sha256 of every
file. The model card and the benchmark read it back.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from eaglequant import __version__
from eaglequant.environment import package_version
from eaglequant.errors import InputError

MANIFEST_FILE = "eaglequant.json"
LIBRARIES = ("amd-quark", "torch", "transformers", "safetensors", "huggingface_hub")


def build_manifest(
    *,
    source: Path,
    recipe: dict[str, Any],
    calibration: dict[str, Any],
    layers: list[dict[str, Any]],
    top1_agreement: list[float],
    timings: dict[str, float],
    files: dict[str, str],
    device: dict[str, Any],
    command: str | None = None,
) -> dict[str, Any]:
    """Provenance: versions, recipe, calibration, per-layer numbers, file checksums."""
    return {
        "tool": "eaglequant",
        "version": __version__,
        "libraries": {name: package_version(name) for name in LIBRARIES},
        "python": platform.python_version(),
        "source": str(source),
        "recipe": recipe,
        "calibration": calibration,
        "layers": layers,
        "top1_agreement_by_step": top1_agreement,
        "device": device,
        "timings_s": timings,
        "files": files,
        "command": command,
    }


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    path = folder / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    os.chmod(path, 0o644)


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of an exported folder; InputError when it is missing or unreadable."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise InputError(f"{path}: missing; the card is built from eaglequant export's manifest")
    return read_json_object(path, "export manifest")


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON object written by eaglequant; InputError naming ``what`` otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(
            f"{path}: cannot read the {what} ({exc}); pass the file eaglequant wrote"
        ) from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: the {what} must be a JSON object")
    return data
