"""``eaglequant capture``: option parsing and reporting only."""

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
    int_list,
    progress,
)

if TYPE_CHECKING:
    from eaglequant.prompts.source import PromptSource


@click.command()
@click.option("--target", "target", type=PATH, required=True, help="Target model folder.")
@click.option(
    "--data",
    type=PROMPTS,
    required=True,
    help=f"Text: .jsonl (text or messages), .txt, or {SETS_HELP}.",
)
@click.argument("out", type=PATH)
@click.option("--draft", type=PATH, help="Draft folder: take its aux layer ids and check the fit.")
@click.option(
    "--aux-layers", help="Comma-separated target layer ids (default: the draft's, else vLLM's)."
)
@click.option("--samples", type=click.IntRange(min=1), default=72, show_default=True)
@click.option("--seq-len", type=click.IntRange(min=2), default=256, show_default=True)
@click.option("--embeddings", is_flag=True, help="Also store the target's input embeddings.")
@engine_choice("--engine", "the capture")
@engine_options
@data_parallel_option
@click.option("--overwrite", is_flag=True)
@click.option("--trust-remote-code", is_flag=True)
def capture(
    target: Path,
    data: PromptSource,
    out: Path,
    draft: Path | None,
    aux_layers: str | None,
    samples: int,
    seq_len: int,
    embeddings: bool,
    engine: str | None,
    tensor_parallel_size: int,
    engine_args: tuple[str, ...],
    data_parallel_size: int,
    overwrite: bool,
    trust_remote_code: bool,
) -> None:
    """Run TARGET on DATA and save token ids + auxiliary hidden states to OUT for export."""
    # lazy: --help latency
    from eaglequant.capture.run import CaptureRequest, capture_hidden_states

    request = CaptureRequest(
        target=target,
        data=data,
        out=out,
        engine=capture_engine(
            engine,
            "--engine",
            engine_settings(tensor_parallel_size, engine_args),
            data_parallel_size,
            trust_remote_code,
        ),
        draft=draft,
        aux_layers=int_list(aux_layers, "--aux-layers", minimum=0, example="1,2,3")
        if aux_layers
        else None,
        samples=samples,
        seq_len=seq_len,
        embeddings=embeddings,
        overwrite=overwrite,
    )
    info = capture_hidden_states(request, progress)
    click.echo(json.dumps({k: v for k, v in info.items() if k != "engine"}))
