"""``eaglequant compare``: option parsing and reporting only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from eaglequant.cli.options import (
    PATH,
    PROMPTS,
    SETS_HELP,
    draft_kv_cache_option,
    engine_choice,
    engine_options,
    engine_per_draft_option,
    engine_settings,
    reference_engine_option,
    tie_margin_option,
)
from eaglequant.cli.options import capture_engine as capture_engine_for
from eaglequant.errors import InputError
from eaglequant.recipe import load_recipe
from eaglequant.results.workload import MAX_TOKENS

if TYPE_CHECKING:
    from eaglequant.prompts.source import PromptSource
    from eaglequant.validate.compare import ReadyDraft


@click.command()
@click.argument("baseline", type=PATH)
@click.option("--target", type=PATH, required=True, help="Target model folder.")
@click.option(
    "--prompts",
    type=PROMPTS,
    required=True,
    multiple=True,
    help=f"Prompts: a .jsonl or .txt file, or {SETS_HELP}; repeat it for several sets, each "
    "reported on its own (every engine runs once, on all of them).",
)
@click.option(
    "--no-chat-template",
    is_flag=True,
    help="Send the prompts raw, not through the target's chat template (used when it has one).",
)
@click.option(
    "--recipes",
    help="Comma-separated candidate recipes, e.g. fp8-static,ptpc-fp8,mxfp8,mxfp4; 'none' (or "
    "left out, with --candidate) exports nothing and needs no calibration.",
)
@click.option(
    "--candidate",
    "candidates",
    multiple=True,
    metavar="[NAME=]DIR",
    help="A ready-made quantized draft of BASELINE (another tool's, or an earlier export), "
    "validated as it is beside the recipes, named by its folder or NAME; repeatable.",
)
@click.option("--calib-data", type=PATH, help="Calibration text, captured once from --target.")
@click.option("--calib-hidden-states", type=PATH, help="A folder written by `eaglequant capture`.")
@click.option("--out", type=PATH, required=True, help="Output folder (candidates and reports).")
@click.option(
    "--k", type=click.IntRange(1, 16), default=3, show_default=True, help="num_speculative_tokens."
)
@click.option("--max-tokens", type=click.IntRange(min=1), default=MAX_TOKENS, show_default=True)
@click.option("--engine-timeout", type=float, default=600.0, show_default=True)
@click.option("--max-model-len", type=click.IntRange(min=16))
@engine_options
@draft_kv_cache_option
@engine_per_draft_option
@reference_engine_option
@tie_margin_option
@engine_choice("--capture-engine", "the calibration capture")
@click.option("--overwrite", is_flag=True)
def compare(
    baseline: Path,
    target: Path,
    prompts: tuple[PromptSource, ...],
    no_chat_template: bool,
    recipes: str | None,
    candidates: tuple[str, ...],
    calib_data: Path | None,
    calib_hidden_states: Path | None,
    out: Path,
    k: int,
    max_tokens: int,
    engine_timeout: float,
    max_model_len: int | None,
    tensor_parallel_size: int,
    engine_args: tuple[str, ...],
    draft_kv_cache_dtype: str | None,
    engine_per_draft: bool,
    reference_engine: bool,
    tie_margin: float,
    tie_steps: float,
    capture_engine: str | None,
    overwrite: bool,
) -> None:
    """Export BASELINE with every recipe from one capture, validate each (and each ready-made
    --candidate) in vLLM, recommend one.

    Exit 0 when a candidate passes (the default fp8-static is recommended when it passes,
    unless another is 5% smaller or decidedly better in acceptance; the reason is printed),
    1 when none does, 2 for bad input.
    """
    # lazy: --help latency
    from eaglequant.prompts.source import load_prompts
    from eaglequant.results.compare_report import COMPARE_MD
    from eaglequant.validate.compare import CompareRequest
    from eaglequant.validate.compare import compare as run

    names = [name.strip() for name in (recipes or "").split(",") if name.strip()]
    if names == ["none"]:
        names = []
    if not names and not candidates:
        raise InputError(
            "--recipes: name at least one recipe, e.g. fp8-static,mxfp4, or pass --candidate DIR"
        )
    request = CompareRequest(
        baseline=baseline,
        target=target,
        prompt_sets=tuple(load_prompts(source) for source in prompts),
        chat_template=not no_chat_template,
        recipes=tuple(load_recipe(name) for name in names),
        ready_made=tuple(ready_draft(value) for value in candidates),
        out=out,
        calib_data=calib_data,
        hidden_states=calib_hidden_states,
        k=k,
        max_tokens=max_tokens,
        draft_kv_cache_dtype=draft_kv_cache_dtype,
        engine=engine_settings(tensor_parallel_size, engine_args, max_model_len),
        capture=capture_engine_for(
            capture_engine, "--capture-engine", engine_settings(tensor_parallel_size, engine_args)
        ),
        engine_timeout_s=engine_timeout,
        engine_per_draft=engine_per_draft,
        reference_engine=reference_engine,
        tie_margin=tie_margin,
        tie_steps=tie_steps,
        overwrite=overwrite,
    )
    report = run(request, progress=lambda m: click.echo(f"[eaglequant] {m}", err=True))
    click.echo((out / COMPARE_MD).read_text())
    sys.exit(0 if report.recommended else 1)


def ready_draft(value: str) -> ReadyDraft:
    """``--candidate [NAME=]DIR``: named NAME, else by its folder's name."""
    # lazy: --help latency
    from eaglequant.validate.compare import ReadyDraft

    name, sep, folder = value.partition("=")
    if not sep or "/" in name:  # a path that holds '=' is a folder
        name, folder = "", value
    if not folder:
        raise InputError(f"--candidate {value}: name a folder, NAME=DIR or DIR")
    path = Path(folder)
    return ReadyDraft(name=name or path.resolve().name, draft=path)
