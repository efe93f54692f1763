"""Option types and option-string parsers shared by the commands.

Option strings are parsed here, in the CLI, so the library's own errors never
name a flag: a bad value is reported with the option that carried it.
"""

from __future__ import annotations

from pathlib import Path

import click

from eaglequant.errors import InputError

PATH = click.Path(path_type=Path)
EXISTING_DIR = click.Path(path_type=Path, file_okay=False)


def progress(message: str) -> None:
    """A library progress line, on stderr."""
    click.echo(f"[eaglequant] {message}", err=True)


def int_list(text: str, option: str, *, minimum: int, example: str) -> tuple[int, ...]:
    """'4,6,8' -> (4, 6, 8); InputError naming ``option`` for a non-integer or a value < minimum."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError as exc:
        raise InputError(
            f"{option} {text!r}: give comma-separated integers, e.g. {example}"
        ) from exc
    if min(values) < minimum:
        raise InputError(f"{option} {text!r}: values must be at least {minimum}")
    return values


def shard_size(text: str) -> int:
    """'5GB', '500MB', '10KB' or a byte count -> bytes; InputError naming --max-shard-size."""
    from huggingface_hub.serialization._base import parse_size_to_int

    if text.strip().isdigit():
        size = int(text)
    else:
        try:
            size = parse_size_to_int(text)
        except ValueError as exc:
            raise InputError(
                f"--max-shard-size {text!r}: not a size; use a byte count or e.g. 5GB, 500MB"
            ) from exc
    if size <= 0:
        raise InputError(f"--max-shard-size {text!r}: must be positive")
    return size
