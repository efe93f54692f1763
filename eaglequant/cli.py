"""The ``eaglequant`` command line: each command parses, calls one library function, reports.

Exit codes: 0 success, 1 a check failed, 2 bad input or usage. Heavy modules
(torch, Quark, vLLM) are imported inside the commands, never at start-up, so
``eaglequant --help`` stays fast.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from eaglequant import __version__
from eaglequant.errors import EagleQuantError

F = TypeVar("F", bound=Callable[..., Any])


def run_reporting_errors(body: Callable[[], Any]) -> Any:
    """Run ``body``; the tool's own errors become one line on stderr and their exit code."""
    try:
        return body()
    except EagleQuantError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        if os.environ.get("EAGLEQUANT_DEBUG"):
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        click.echo(
            f"error: unexpected {type(exc).__name__}: {message[:300]}; nothing was published "
            "(rerun with EAGLEQUANT_DEBUG=1 for the traceback and report it)",
            err=True,
        )
        sys.exit(1)


def reports_errors(func: F) -> F:
    """Decorator form of ``run_reporting_errors``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return run_reporting_errors(lambda: func(*args, **kwargs))

    return wrapper  # type: ignore[return-value]


EXISTING_DIR = click.Path(path_type=Path, file_okay=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eaglequant")
def main() -> None:
    """Turn a BF16 EAGLE-3 draft into a static FP8 E4M3 draft that vLLM loads, and prove it."""


@main.command()
@click.argument("path", type=EXISTING_DIR)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--target-layers",
    type=click.IntRange(min=0),
    default=32,
    show_default=True,
    help="The target's layer count N (vLLM names the draft layer model.layers.N).",
)
@reports_errors
def inspect(path: Path, as_json: bool, target_layers: int) -> None:
    """Summarise a draft folder and predict how vLLM builds each layer.

    Exit 0 when clean, 1 when problems were found, 2 when the input is unreadable.
    """
    from eaglequant.inspect_draft import inspect_checkpoint

    report = inspect_checkpoint(path, target_layers)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        from eaglequant.report import print_inspect

        print_inspect(report)
    sys.exit(1 if report.problems else 0)


@main.command("fix-config")
@click.argument("path", type=EXISTING_DIR)
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), help="Write a repaired copy here instead."
)
@click.option("--overwrite", is_flag=True, help="Replace a non-empty --output folder.")
@reports_errors
def fix_config_command(path: Path, output: Path | None, overwrite: bool) -> None:
    """Rewrite quantization_config.exclude as regexes vLLM matches (re:.*fc.*, re:.*lm_head.*)."""
    from eaglequant.fix_config import fix_config

    result = fix_config(path, output, overwrite)
    verb = "rewrote" if result.changed else "already correct, unchanged:"
    click.echo(f"{verb} exclude {result.before} -> {result.after} in {result.written_to}")


@main.command()
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
@click.option("--license", "license_id", help="License id for the front matter.")
@reports_errors
def card(
    folder: Path,
    base_model: str,
    validation: Path | None,
    tune_dir: Path | None,
    license_id: str | None,
) -> None:
    """Write the Hugging Face model card (README.md) of an exported FP8 draft FOLDER."""
    from eaglequant.card import write_card

    path = write_card(folder, base_model, validation, tune_dir, license_id)
    click.echo(f"wrote {path}")


@main.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--target-steps", type=click.IntRange(min=1), default=800, show_default=True)
@click.option("--draft-steps", type=click.IntRange(min=1), default=900, show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUT.")
@reports_errors
def toy(out: Path, seed: int, target_steps: int, draft_steps: int, overwrite: bool) -> None:
    """Train the embedded toy pair (target, EAGLE-3 draft, prompts) into OUT (~15 min, 2 cores)."""
    from eaglequant.output import atomic_output_dir, check_output_path
    from eaglequant.toy import ToySettings, make_pair

    check_output_path(out, [], overwrite)
    settings = ToySettings(seed=seed, target_steps=target_steps, draft_train_steps=draft_steps)
    with atomic_output_dir(out, overwrite) as temp:
        make_pair(temp, settings, log=lambda m: click.echo(f"[toy] {m}", err=True))


def _register_commands() -> None:
    from eaglequant.cli_export import capture, export
    from eaglequant.cli_validate import tune, validate

    main.add_command(export)
    main.add_command(capture)
    main.add_command(validate)
    main.add_command(tune)


_register_commands()

if __name__ == "__main__":
    main()
