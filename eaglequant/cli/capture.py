"""``eaglequant capture``: option parsing and reporting only."""

from __future__ import annotations

import json
from pathlib import Path

import click

from eaglequant.cli.options import PATH, int_list


@click.command()
@click.option("--target", "target", type=PATH, required=True, help="Target model folder.")
@click.option("--data", type=PATH, required=True, help="Text: .jsonl (text or messages) or .txt.")
@click.argument("out", type=PATH)
@click.option("--draft", type=PATH, help="Draft folder: take its aux layer ids and check the fit.")
@click.option(
    "--aux-layers", help="Comma-separated target layer ids (default: the draft's, else vLLM's)."
)
@click.option("--samples", type=click.IntRange(min=1), default=72, show_default=True)
@click.option("--seq-len", type=click.IntRange(min=2), default=256, show_default=True)
@click.option("--embeddings", is_flag=True, help="Also store the target's input embeddings.")
@click.option("--overwrite", is_flag=True)
@click.option("--trust-remote-code", is_flag=True)
def capture(
    target: Path,
    data: Path,
    out: Path,
    draft: Path | None,
    aux_layers: str | None,
    samples: int,
    seq_len: int,
    embeddings: bool,
    overwrite: bool,
    trust_remote_code: bool,
) -> None:
    """Run TARGET on DATA and save token ids + auxiliary hidden states to OUT for export."""
    from eaglequant.quantize.capture import CaptureRequest, capture_hidden_states

    request = CaptureRequest(
        target=target,
        data=data,
        out=out,
        draft=draft,
        aux_layers=int_list(aux_layers, "--aux-layers", minimum=0, example="1,2,3")
        if aux_layers
        else None,
        samples=samples,
        seq_len=seq_len,
        embeddings=embeddings,
        overwrite=overwrite,
        trust_remote_code=trust_remote_code,
    )
    click.echo(json.dumps(capture_hidden_states(request)))
