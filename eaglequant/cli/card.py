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
    "--validation",
    "validations",
    type=click.Path(path_type=Path),
    multiple=True,
    help="A report from validate --json; repeat it for each prompt set validated (the card "
    "then tabulates each set's row; the first one's run gives the usage line).",
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
@click.option(
    "--repo-id",
    help="The Hub repository it is published as (ORG/NAME), named in the usage line "
    "(default: a <REPO_ID> placeholder; publish needs the card to name its repository).",
)
def card(
    folder: Path,
    base_model: str,
    validations: tuple[Path, ...],
    tune_dir: Path | None,
    compare_dir: Path | None,
    license_id: str | None,
    repo_id: str | None,
) -> None:
    """Write the Hugging Face model card (README.md) of an exported FP8 draft FOLDER.

    Refuses (exit 2) a folder whose files differ from its manifest and a validation report
    made for other bytes.
    """
    # lazy: --help latency
    from eaglequant.hub.card import write_card

    path = write_card(
        folder,
        base_model=base_model,
        validations=validations,
        tune_dir=tune_dir,
        license_id=license_id,
        repo_id=repo_id,
        compare_dir=compare_dir,
    )
    click.echo(f"wrote {path}")
