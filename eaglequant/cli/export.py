"""``eaglequant export``: option parsing and reporting only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from eaglequant.cli.options import (
    PATH,
    PROMPTS,
    SETS_HELP,
    capture_engine,
    data_parallel_option,
    engine_choice,
    engine_options,
    engine_settings,
    invocation,
    progress,
    shard_size,
)
from eaglequant.errors import InputError
from eaglequant.recipe import load_recipe

if TYPE_CHECKING:
    from eaglequant.capture.run import CaptureEngine
    from eaglequant.prompts.source import PromptSource
    from eaglequant.quantize.sources import CalibrationSource


def _calibration_source(
    calib: str | None,
    calib_target: Path | None,
    calib_data: PromptSource | None,
    calib_hidden_states: Path | None,
    samples: int | None,
    seq_len: int | None,
    engine: CaptureEngine,
    needs_calibration: bool,
) -> CalibrationSource:
    # lazy: --help latency
    from eaglequant.quantize.sources import CalibrationSource

    given = [x for x in (calib_target or calib_data, calib_hidden_states, calib) if x]
    if len(given) > 1:
        raise InputError(
            "choose one calibration source: --calib-target with --calib-data, "
            "--calib-hidden-states, or --calib none"
        )
    if calib_target or calib_data:
        if not (calib_target and calib_data):
            raise InputError("--calib-target and --calib-data go together; pass both")
        return CalibrationSource(
            kind="target",
            target=calib_target,
            data=calib_data,
            samples=samples,
            seq_len=seq_len,
            engine=engine,
        )
    if calib_hidden_states:
        return CalibrationSource(kind="capture", capture=calib_hidden_states, samples=samples)
    if calib == "none" or not needs_calibration:
        return CalibrationSource(kind="none")
    raise InputError(
        "a static recipe needs calibration inputs: pass --calib-target DIR --calib-data FILE, "
        "--calib-hidden-states DIR (from `eaglequant capture`), or --calib none"
    )


@click.command()
@click.argument("src", type=PATH)
@click.argument("out", type=PATH, required=False)
@click.option(
    "--recipe",
    default="fp8-static",
    show_default=True,
    help="Recipe name in configs/ or a YAML path.",
)
@click.option(
    "--calib-target", type=PATH, help="Target model folder to capture hidden states from."
)
@click.option(
    "--calib-data",
    type=PROMPTS,
    help=f"Calibration text: .jsonl (text or messages), .txt, or {SETS_HELP}.",
)
@click.option("--calib-hidden-states", type=PATH, help="A folder written by `eaglequant capture`.")
@click.option(
    "--calib",
    type=click.Choice(["none"]),
    help="'none': fixed input range from the recipe (uncalibrated).",
)
@click.option(
    "--calib-samples", type=click.IntRange(min=1), help="Calibration sequences (recipe default)."
)
@click.option(
    "--calib-seq-len", type=click.IntRange(min=2), help="Tokens per calibration sequence."
)
@engine_choice("--calib-engine", "calibration with --calib-target")
@engine_options
@data_parallel_option
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Where Quark calibration and the held-out measurement run (cuda: CUDA or ROCm).",
)
@click.option(
    "--max-shard-size", default="5GB", show_default=True, help="Shard size, e.g. 5GB or 500MB."
)
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUT.")
@click.option("--dry-run", is_flag=True, help="Run every check, print the plan, write nothing.")
@click.option("--dump-recipe", is_flag=True, help="Print the resolved recipe as YAML and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the result (manifest) as JSON.")
@click.option(
    "--trust-remote-code", is_flag=True, help="Allow the calibration target's custom code."
)
@click.option("--base-model", help="Also write the model card for this target (Hub name).")
def export(
    src: Path,
    out: Path | None,
    recipe: str,
    calib_target: Path | None,
    calib_data: PromptSource | None,
    calib_hidden_states: Path | None,
    calib: str | None,
    calib_samples: int | None,
    calib_seq_len: int | None,
    calib_engine: str | None,
    tensor_parallel_size: int,
    engine_args: tuple[str, ...],
    data_parallel_size: int,
    device: str,
    max_shard_size: str,
    overwrite: bool,
    dry_run: bool,
    dump_recipe: bool,
    as_json: bool,
    trust_remote_code: bool,
    base_model: str | None,
) -> None:
    """Quantize the BF16 EAGLE-3 draft SRC to static FP8 E4M3 into OUT."""
    resolved = load_recipe(recipe)
    if dump_recipe:
        # lazy: --help latency
        import yaml

        click.echo(yaml.safe_dump(resolved.to_dict(), sort_keys=False))
        return
    if out is None:
        raise InputError("missing OUT: eaglequant export SRC OUT")
    # lazy: --help latency
    from eaglequant.quantize.export import ExportRequest, export_draft
    from eaglequant.quantize.timing import process_started

    request = ExportRequest(
        src=src,
        out=out,
        recipe=resolved,
        calibration=_calibration_source(
            calib,
            calib_target,
            calib_data,
            calib_hidden_states,
            calib_samples,
            calib_seq_len,
            capture_engine(
                calib_engine,
                "--calib-engine",
                engine_settings(tensor_parallel_size, engine_args),
                data_parallel_size,
                trust_remote_code,
            ),
            resolved.needs_calibration and not resolved.calibration.fixed,
        ),
        max_shard_size=shard_size(max_shard_size),
        overwrite=overwrite,
        dry_run=dry_run,
        device=device,
        command=invocation(),
    )
    result = export_draft(request, progress=progress, started=process_started())
    if base_model and not dry_run:
        # lazy: --help latency
        from eaglequant.hub.card import write_card

        write_card(out, base_model=base_model)
    if as_json:
        click.echo(
            json.dumps(result.manifest if not dry_run else {"plan": result.plan.steps}, indent=2)
        )
        return
    # lazy: --help latency
    from eaglequant.render.terminal import print_export

    print_export(result)
