"""``eaglequant inspect``: option parsing and reporting only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from eaglequant.cli.options import EXISTING_DIR
from eaglequant.rules.exclusions import DEFAULT_TARGET_LAYERS


@click.command()
@click.argument("path", type=EXISTING_DIR)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--target-layers",
    type=click.IntRange(min=0),
    default=DEFAULT_TARGET_LAYERS,
    show_default=True,
    help="The target's layer count N (vLLM names the draft layer model.layers.N).",
)
def inspect(path: Path, as_json: bool, target_layers: int) -> None:
    """Summarise a draft folder and predict how vLLM builds each layer.

    Exit 0 when clean, 1 when problems were found, 2 when the input is unreadable.
    """
    # lazy: --help latency
    from eaglequant.rules.inspection import inspect_checkpoint

    report = inspect_checkpoint(path, target_layers)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        # lazy: --help latency
        from eaglequant.render.terminal import print_inspect

        print_inspect(report)
    sys.exit(1 if report.problems else 0)
