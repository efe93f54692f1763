"""The prompts file format and the prompt record every source yields.

``.jsonl``: one object a line with the prompt in ``text``, ``prompt`` or
``turns`` (a list of strings: a multi-turn question; the first turn is the prompt, the
second is kept as its ``followup``, asked after the model's own answer where a command measures
second turns; later turns are not read), and optionally ``category`` (a string). ``.txt``: one
prompt a line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from eaglequant.errors import InputError
from eaglequant.io.textfiles import jsonl_records, read_utf8

TEXT_HASH_CHARS = 16


class PromptSetRecord(TypedDict):
    """Which prompts a report was measured on: the source as given, its file's sha256, count."""

    source: str
    sha256: str
    prompts: int


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text (the first turn of a multi-turn record), its category, and the
    record's second turn (None: a single-turn prompt)."""

    text: str
    category: str | None = None
    followup: str | None = None


def text_hash(text: str) -> str:
    """A prompt's identity across reports: the first hex digits of its UTF-8 text's sha256."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:TEXT_HASH_CHARS]


def read_prompt_file(path: Path) -> list[Prompt]:
    """Prompts from a .jsonl (see the module docstring) or .txt; InputError naming file:line."""
    raw = read_utf8(path, "prompts")
    if path.suffix == ".jsonl":
        prompts = [prompt_record(f"{path}:{n}", record) for n, record in jsonl_records(path, raw)]
    else:
        prompts = [Prompt(line) for line in raw.splitlines() if line.strip()]
    if not prompts:
        raise InputError(f"{path}: holds no prompts")
    return prompts


def prompt_record(where: str, record: dict[str, Any]) -> Prompt:
    """One record's prompt; ``where`` (file:line) names it in the error."""
    text = record.get("text", record.get("prompt"))
    followup = None
    if text is None and "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise InputError(f"{where}: 'turns' must be a non-empty list of strings")
        text = turns[0]
        followup = turns[1] if len(turns) > 1 and turns[1].strip() else None
    if not isinstance(text, str):
        raise InputError(f"{where}: needs a 'text' or 'prompt' string or a 'turns' list")
    category = record.get("category")
    if category is not None and not isinstance(category, str):
        raise InputError(f"{where}: 'category' must be a string, got {category!r}")
    return Prompt(text, category, followup)


def read_prompts(path: Path) -> list[str]:
    """The prompt texts of a prompts file (see :func:`read_prompt_file`)."""
    return [p.text for p in read_prompt_file(path)]
