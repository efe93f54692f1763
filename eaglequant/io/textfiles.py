"""Text inputs the commands read: UTF-8 files and JSON Lines records, with line numbers.

Calibration data (``export``, ``capture``) and validation prompts (``validate``)
are both ``.jsonl`` or plain text; each reader picks its fields from the
records this module yields, so file and line errors read the same everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eaglequant.errors import InputError


def read_utf8(path: Path, what: str) -> str:
    """The text of ``path``; InputError naming ``what`` when it is missing or not UTF-8."""
    if not path.is_file():
        raise InputError(f"{path}: no such {what} file")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); convert it to UTF-8") from exc


def jsonl_records(path: Path, raw: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; InputError for a line that is not one."""
    records = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{path}:{number}: not a JSON object ({exc.msg}); fix the line"
            ) from exc
        if not isinstance(record, dict):
            raise InputError(f"{path}:{number}: not a JSON object; fix the line")
        records.append((number, record))
    return records
