"""The validation report (``validate --json``) as a typed file: its kind, schema version, reader.

Readers of a report (``validate --against``, the model card, publishing) go
through :func:`read_report`, which refuses anything but a report of this
schema with one line naming the file and what to do.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from eaglequant.errors import InputError
from eaglequant.manifest import read_json_object

REPORT_KIND = "eaglequant validation report"
SCHEMA_VERSION = 1
REPORT_KEYS = ("checks", "engines", "passed", "verdict", "prompts_sha256", "k", "max_tokens")


def prompts_digest(prompts: list[str]) -> str:
    """One hash of the prompt list, in order: equal hashes, the same prompts."""
    return hashlib.sha256(json.dumps(prompts, ensure_ascii=False).encode()).hexdigest()


def read_report(path: Path) -> dict[str, Any]:
    """A validation report of this schema; InputError naming ``path`` for anything else."""
    data = read_json_object(path, "validation report")
    kind, version = data.get("kind"), data.get("schema_version")
    if kind != REPORT_KIND:
        if kind is None and "checks" in data and "engines" in data:
            raise InputError(
                f"{path}: a validation report from an older eaglequant (no schema_version); "
                "run eaglequant validate --json again to write a current one"
            )
        raise InputError(
            f"{path}: not an eaglequant validation report (kind {kind!r}); "
            "pass a file written by eaglequant validate --json"
        )
    if version != SCHEMA_VERSION:
        raise InputError(
            f"{path}: validation report schema_version {version!r}, this eaglequant reads "
            f"{SCHEMA_VERSION}; run eaglequant validate --json again with this version"
        )
    missing = [key for key in REPORT_KEYS if key not in data]
    if missing:
        raise InputError(f"{path}: validation report without {missing}; the file is incomplete")
    return data
