"""``eaglequant fix-config``: option parsing and reporting only."""

from __future__ import annotations

from pathlib import Path

import click

from eaglequant.cli.options import EXISTING_DIR


@click.command("fix-config")
@click.argument("path", type=EXISTING_DIR)
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), help="Write a repaired copy here instead."
)
@click.option("--overwrite", is_flag=True, help="Replace a non-empty --output folder.")
def fix_config_command(path: Path, output: Path | None, overwrite: bool) -> None:
    """Rewrite quantization_config.exclude as regexes vLLM matches (re:.*fc.*, re:.*lm_head.*)."""
    from eaglequant.fix_config import fix_config

    result = fix_config(path, output, overwrite)
    verb = "rewrote" if result.changed else "already correct, unchanged:"
    click.echo(f"{verb} exclude {result.before} -> {result.after} in {result.written_to}")
