"""``eaglequant fix-config``: option parsing and reporting only."""

from __future__ import annotations

from pathlib import Path

import click

from eaglequant.cli.options import EXISTING_DIR
from eaglequant.rules.exclusions import DEFAULT_TARGET_LAYERS


@click.command("fix-config")
@click.argument("path", type=EXISTING_DIR)
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), help="Write a repaired copy here instead."
)
@click.option("--overwrite", is_flag=True, help="Replace a non-empty --output folder.")
@click.option(
    "--d2t-from",
    "d2t_from",
    type=EXISTING_DIR,
    help="The BF16 draft this one was made from: restore d2t/t2d cast to a float from it.",
)
@click.option(
    "--target-layers",
    type=click.IntRange(min=0),
    default=DEFAULT_TARGET_LAYERS,
    show_default=True,
    help="The target's layer count N (vLLM names the draft layer model.layers.N).",
)
def fix_config_command(
    path: Path, output: Path | None, overwrite: bool, d2t_from: Path | None, target_layers: int
) -> None:
    """Rewrite the exclusion list vLLM reads (Quark's exclude, compressed-tensors' and
    ModelOpt's ignore, fp8's ignored_layers) so vLLM builds each layer as the draft stores it;
    with --d2t-from, restore float-cast d2t/t2d from the BF16 draft."""
    # lazy: --help latency
    from eaglequant.rules.fix_config import fix_config

    result = fix_config(path, output, overwrite, d2t_from=d2t_from, target_layers=target_layers)
    where = f"in {result.written_to}"
    if result.after != result.before:
        click.echo(f"rewrote {result.key} {result.before} -> {result.after} {where}")
    else:
        click.echo(f"already correct, unchanged: {result.key} {result.before} {where}")
    if result.restored:
        click.echo(f"restored {', '.join(result.restored)} from {d2t_from} {where}")
