"""The export manifest (``eaglequant.json``): its name, its fields, its writer and its reader.

``eaglequant export`` writes it beside the weights: tool and library versions,
the recipe, where the calibration came from, per-layer scales and SQNR,
top-1 agreement by speculative step, stage timings and the sha256 of every
file. The model card and the benchmark read it back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict, cast

from eaglequant import __version__
from eaglequant.errors import InputError
from eaglequant.results.environment import package_version

MANIFEST_FILE = "eaglequant.json"
# Bumped whenever a field changes meaning or goes away; readers refuse other versions.
MANIFEST_SCHEMA = 1
LIBRARIES = ("amd-quark", "torch", "transformers", "safetensors", "huggingface_hub")


class LayerRecord(TypedDict):
    """One quantized linear: its weight's and input's ranges and scales (input None: dynamic)
    and its output SQNR against BF16 on held-out inputs (None: not measured)."""

    name: str
    weight_amax: float
    weight_scale: float
    input_amax: float | None
    input_scale: float | None
    sqnr_db: float | None


class CalibrationRecord(TypedDict):
    """Where the calibration inputs came from (``kind``: capture, target or none) and how many
    were used; ``capture``: the capture's engine and sizes, when states were captured."""

    source: str
    kind: str
    calibrated: bool
    sequences: int
    tokens: int
    held_out_tokens: int
    speculative_steps: int
    aux_layer_ids: list[int] | None
    capture: dict[str, Any] | None


class DeviceRecord(TypedDict, total=False):
    """Where the export's arithmetic ran: a GPU's name and runtime, or the CPU's threads,
    ISA capability and the GEMM paths taken."""

    type: str
    name: str
    runtime: str
    threads: int
    capability: str
    gemm: list[str]


class Manifest(TypedDict):
    """The manifest's fields (``eaglequant.json``), as export writes them."""

    tool: str
    schema_version: int
    version: str
    libraries: dict[str, str | None]
    python: str
    source: str
    recipe: dict[str, Any]
    calibration: CalibrationRecord
    layers: list[LayerRecord]
    top1_agreement_by_step: list[float]
    device: DeviceRecord
    timings_s: dict[str, float]
    files: dict[str, str]
    command: str | None  # how export was run, path-free (eaglequant.results.provenance)


def build_manifest(
    *,
    source: Path,
    recipe: dict[str, Any],
    calibration: CalibrationRecord,
    layers: list[LayerRecord],
    top1_agreement: list[float],
    timings: dict[str, float],
    files: dict[str, str],
    device: DeviceRecord,
    command: str | None = None,
) -> Manifest:
    """Provenance: versions, recipe, calibration, per-layer numbers, file checksums."""
    return {
        "tool": "eaglequant",
        "schema_version": MANIFEST_SCHEMA,
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


def write_manifest(folder: Path, manifest: Manifest) -> None:
    path = folder / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    os.chmod(path, 0o644)


def read_manifest(folder: Path) -> Manifest:
    """The manifest of an exported folder; InputError when it is missing, unreadable, another
    tool's or another schema version's."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise InputError(f"{path}: missing; export the draft with eaglequant export")
    data = read_json_object(path, "export manifest")
    check_schema(path, data, "export manifest", MANIFEST_SCHEMA, "re-export the draft")
    return cast(Manifest, data)


def check_schema(path: Path, data: dict[str, Any], what: str, version: int, fix: str) -> None:
    """InputError unless ``data`` is eaglequant's ``what`` at schema ``version``."""
    if data.get("tool") != "eaglequant":
        raise InputError(f"{path}: not an eaglequant {what} (no 'tool': 'eaglequant'); {fix}")
    found = data.get("schema_version")
    if found != version:
        raise InputError(
            f"{path}: {what} schema version {found!r}, this eaglequant reads {version}; {fix}"
        )


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


def field_values(kind: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a JSON object that are fields of the dataclass ``kind`` (what a reader of
    eaglequant's own files builds the type from; other keys, like ``tool``, are left out)."""
    names = {f.name for f in dataclasses.fields(kind)}
    return {key: value for key, value in data.items() if key in names}
