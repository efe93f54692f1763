"""The ``eaglequant`` command line: one module per command, one error boundary in the group.

Each command parses its options, calls one library function and reports.
The group turns the tool's own errors into one ``error: …`` line and their
exit code (0 success, 1 a check failed, 2 bad input or usage). Heavy modules
(torch, Quark, vLLM) are imported inside the commands, never at start-up, so
``eaglequant --help`` stays fast.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import click

from eaglequant import __version__, termination
from eaglequant.cli.acceptance import acceptance
from eaglequant.cli.capture import capture
from eaglequant.cli.card import card
from eaglequant.cli.compare import compare
from eaglequant.cli.example import example
from eaglequant.cli.export import export
from eaglequant.cli.fix_config import fix_config_command
from eaglequant.cli.inspect import inspect
from eaglequant.cli.options import ARGV_KEY
from eaglequant.cli.prompts import prompts
from eaglequant.cli.publish import publish
from eaglequant.cli.toy import toy
from eaglequant.cli.tune import tune
from eaglequant.cli.validate import validate
from eaglequant.errors import EagleQuantError
from eaglequant.interpreter import exit_at_once


class ReportingGroup(click.Group):
    """A group whose commands' errors become one line on stderr and their exit code."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[ARGV_KEY] = list(args)  # for the commands that record how they were run
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            if ctx.invoked_subcommand in _ENDS_AT_ONCE:
                _finished.append(ctx.invoked_subcommand)
            return result
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
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


@click.group(cls=ReportingGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eaglequant")
def main() -> None:
    """Turn a BF16 EAGLE-3 draft into a static FP8 E4M3 draft that vLLM loads, and prove it."""
    # A SIGTERM (a CI job's timeout, a scheduler) unwinds like Ctrl-C, so every engine child's
    # process group and every server is stopped on the way out instead of left running.
    signal.signal(signal.SIGTERM, termination.exit_on_signal)


def run() -> None:
    """The ``eaglequant`` script: :func:`main`, ended without the interpreter's teardown
    after a command of ``_ENDS_AT_ONCE`` succeeded (its output is on disk and synced; freeing
    torch, transformers and Quark object by object takes seconds)."""
    _finished.clear()  # only what this run finished counts
    try:
        main()
    except SystemExit as exc:
        if exc.code in (0, None) and _finished:
            exit_at_once(0)
        raise


_ENDS_AT_ONCE = frozenset({"export"})
_finished: list[str] = []  # the command of _ENDS_AT_ONCE that succeeded in this run

_COMMANDS = (inspect, fix_config_command, card, toy, export, capture, validate, tune, publish)
for _command in (*_COMMANDS, prompts, compare, acceptance, example):
    main.add_command(_command)

if __name__ == "__main__":
    run()
