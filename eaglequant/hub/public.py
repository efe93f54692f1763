"""What the card shows instead of this machine's paths: the public names of the models, and
reports with every local path replaced and their environment reduced to what reproduces
them (also what ``publish`` uploads of the manifest)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglequant.results.environment import reproducing_env

BASELINE_NAME = "<BF16_DRAFT>"
NO_REPO_ID = "<REPO_ID>"


@dataclass(frozen=True, kw_only=True)
class PublicNames:
    """What the card calls the models instead of their local paths."""

    base_model: str
    repo_id: str


def local_paths(
    folder: Path,
    manifest: Mapping[str, Any],
    report: Mapping[str, Any] | None,
    tuning: Mapping[str, Any] | None,
) -> list[str]:
    """The paths of this machine the inputs name (with a slash as given, and resolved),
    longest first: none may appear in the card."""
    given = [str(folder), str(manifest.get("source") or "")]
    capture = (manifest.get("calibration") or {}).get("capture") or {}
    given += [str(capture.get(k) or "") for k in ("target", "data")]
    for data in (report, tuning):
        given += [v for k in PATH_FIELDS if isinstance(v := (data or {}).get(k), str)]
    found = set()
    for path in given:
        if path and path not in (".", "/"):
            found.add(str(Path(path).resolve()))
            if "/" in path:
                found.add(path)
    return sorted(found, key=len, reverse=True)


# The report fields that name local paths, and what the card calls them.
PATH_FIELDS = ("target", "draft", "baseline", "prompts")


def public(data: Mapping[str, Any], names: PublicNames, local: list[str]) -> dict[str, Any]:
    """A report with its local paths replaced by public names and its environment variables
    reduced to the reproducing ones (no per-run random values)."""
    named = {
        "target": names.base_model,
        "draft": names.repo_id,
        "baseline": BASELINE_NAME,
        "prompts": "<PROMPTS>",
    }
    replacements: list[tuple[str, str]] = []
    for key, name in named.items():
        path = data.get(key)
        if not isinstance(path, str) or not path:
            continue
        replacements += [(json.dumps(path), json.dumps(name)), (f"`{path}`", f"`{name}`")]
        replacements += [(f"serve {path} ", f"serve {name} ")]
        if "/" in path:
            replacements += [(path, name), (str(Path(path).resolve()), name)]
    replacements += [(path, "<PATH>") for path in local]
    replacements += [(path, Path(path).name) for path in _described_files(data)]
    replacements.sort(key=lambda pair: len(pair[0]), reverse=True)
    cleaned = replace_strings(_without_run_env(data), replacements)
    return cleaned | {k: name for k, name in named.items() if isinstance(data.get(k), str)}


def _described_files(data: Mapping[str, Any]) -> list[str]:
    """Files a report names to describe its inputs (a prompts file, the calibration data):
    the card keeps their names, not where they lie."""
    found = [
        (data.get("prompt_set") or {}).get("source"),
        (data.get("calibration_overlap") or {}).get("calibration"),
    ]
    return [f for f in found if isinstance(f, str) and "/" in f]


def _without_run_env(data: Any) -> Any:
    if isinstance(data, dict):
        return {
            k: reproducing_env(v) if k == "env" and isinstance(v, dict) else _without_run_env(v)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [_without_run_env(v) for v in data]
    return data


def replace_strings(data: Any, replacements: list[tuple[str, str]]) -> Any:
    """``data`` (JSON-like) with each (old, new) substring replaced in every string, in order."""
    if isinstance(data, str):
        for path, name in replacements:
            data = data.replace(path, name)
        return data
    if isinstance(data, dict):
        return {k: replace_strings(v, replacements) for k, v in data.items()}
    if isinstance(data, list):
        return [replace_strings(v, replacements) for v in data]
    return data
