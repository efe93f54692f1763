"""``eaglequant toy``: option parsing and reporting only."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--target-steps", type=click.IntRange(min=1), default=800, show_default=True)
@click.option("--draft-steps", type=click.IntRange(min=1), default=900, show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUT.")
def toy(out: Path, seed: int, target_steps: int, draft_steps: int, overwrite: bool) -> None:
    """Train the embedded toy pair (target, EAGLE-3 draft, prompts) into OUT (~15 min, 2 cores)."""
    from eaglequant.devtools.toy import ToySettings, make_pair
    from eaglequant.io.output import atomic_output_dir, check_output_path

    check_output_path(out, [], overwrite)
    settings = ToySettings(seed=seed, target_steps=target_steps, draft_train_steps=draft_steps)
    with atomic_output_dir(out, overwrite) as temp:
        make_pair(temp, settings, log=lambda m: click.echo(f"[toy] {m}", err=True))
