"""``eaglequant card``: option parsing and reporting only."""

from __future__ import annotations

from pathlib import Path

import click

from eaglequant.cli.options import EXISTING_DIR


@click.command()
@click.argument("folder", type=EXISTING_DIR)
@click.option(
    "--base-model", required=True, help="The target model's Hub name, e.g. amd/Kimi-K2.5-MXFP4."
)
@click.option(
    "--validation", type=click.Path(path_type=Path), help="A report from validate --json."
)
@click.option(
    "--tune", "tune_dir", type=click.Path(path_type=Path), help="A folder from tune --out."
)
@click.option(
    "--compare",
    "compare_dir",
    type=click.Path(path_type=Path),
    help="A folder from compare --out: embeds its comparison table.",
)
@click.option("--license", "license_id", help="License id for the front matter.")
def card(
    folder: Path,
    base_model: str,
    validation: Path | None,
    tune_dir: Path | None,
    compare_dir: Path | None,
    license_id: str | None,
) -> None:
    """Write the Hugging Face model card (README.md) of an exported FP8 draft FOLDER."""
    from eaglequant.render.card import write_card

    path = write_card(folder, base_model, validation, tune_dir, license_id, compare_dir)
    click.echo(f"wrote {path}")
