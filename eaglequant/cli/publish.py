"""``eaglequant publish``: option parsing and reporting only."""

from __future__ import annotations

from pathlib import Path

import click

from eaglequant.cli.options import EXISTING_DIR, PATH
from eaglequant.errors import InputError


@click.command()
@click.argument("folder", type=EXISTING_DIR)
@click.option("--repo-id", required=True, help="The Hub repository, ORG/NAME.")
@click.option(
    "--validation",
    type=PATH,
    help="The validate --json report of this folder (default: FOLDER/validation.json).",
)
@click.option("--revision", help="The branch to commit to (default: main); it must exist.")
@click.option("--create-pr", is_flag=True, help="Open a pull request instead of committing.")
@click.option("--private", is_flag=True, help="Create the repository private (when missing).")
@click.option("--dry-run", is_flag=True, help="Run every check and list the files; send nothing.")
def publish(
    folder: Path,
    repo_id: str,
    validation: Path | None,
    revision: str | None,
    create_pr: bool,
    private: bool,
    dry_run: bool,
) -> None:
    """Upload the exported FP8 draft FOLDER to the Hugging Face Hub in one commit.

    Refuses (exit 2, naming the file) unless every file equals the manifest, the validation
    report passed on exactly these files, and the card (README.md) was rendered from them.
    The token comes from HF_TOKEN or `hf auth login`; HF_ENDPOINT names another Hub.
    """
    # lazy: --help latency
    from eaglequant.hub.publish import PublishRequest
    from eaglequant.hub.publish import publish as run

    if "/" not in repo_id:
        raise InputError(f"--repo-id {repo_id!r}: give ORG/NAME, e.g. amd/Kimi-K2.5-Eagle3-FP8")
    result = run(
        PublishRequest(
            folder=folder,
            repo_id=repo_id,
            validation=validation,
            revision=revision,
            create_pr=create_pr,
            private=private,
            dry_run=dry_run,
        )
    )
    where = f"{result.repo_id}@{result.revision}"
    if result.dry_run:
        click.echo(
            f"would upload {len(result.files)} files ({result.total_bytes} bytes) to {where}:"
        )
        for upload in result.files:
            click.echo(f"{upload.size:>14}  {upload.path}")
        click.echo(f"{result.verdict}; dry run: nothing was sent")
        return
    if result.created:
        click.echo(f"created repository {result.repo_id}")
    if not result.changed:
        click.echo(
            f"nothing changed: the {len(result.files)} files on {where} equal the local ones; "
            "no commit made"
        )
        return
    click.echo(f"committed {len(result.changed)} of {len(result.files)} files to {where}")
    click.echo(result.pr_url or result.commit_url or "")
