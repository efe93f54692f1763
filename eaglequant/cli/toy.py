"""``eaglequant toy``: option parsing and reporting only."""

from __future__ import annotations

from pathlib import Path

import click

from eaglequant.cli.example import require_examples


@click.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--target-steps", type=click.IntRange(min=1), default=800, show_default=True)
@click.option("--draft-steps", type=click.IntRange(min=1), default=900, show_default=True)
@click.option(
    "--target",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    help="Train only a draft, into OUT, for this already-trained toy target.",
)
@click.option(
    "--draft-format",
    type=click.Choice(["eagle3", "speculators"]),
    default="eagle3",
    show_default=True,
    help="speculators: the vllm-project/speculators format (needs --target).",
)
@click.option("--norm-before-residual", is_flag=True, help="Train the draft with this variant.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUT.")
def toy(
    out: Path,
    seed: int,
    target_steps: int,
    draft_steps: int,
    target: Path | None,
    draft_format: str,
    norm_before_residual: bool,
    overwrite: bool,
) -> None:
    """Train the embedded toy pair (target, EAGLE-3 draft, prompts) into OUT (~30 min, 2 cores).

    With --target, only a draft for that target (~15 min).
    """
    require_examples("toy")
    # lazy: --help latency
    from eaglequant.io.output import atomic_output_dir, check_output_path
    from eaglequant_examples.toy import ToySettings, make_draft, make_pair

    if draft_format == "speculators" and target is None:
        raise click.UsageError("--draft-format speculators needs --target (the trained toy target)")
    check_output_path(out, [target] if target else [], overwrite)
    settings = ToySettings(
        seed=seed,
        target_steps=target_steps,
        draft_train_steps=draft_steps,
        norm_before_residual=norm_before_residual,
    )
    with atomic_output_dir(out, overwrite) as temp:
        if target is None:
            make_pair(temp, settings, log=_log)
        else:
            verifier = str(target) if draft_format == "speculators" else None
            make_draft(temp, target, settings, verifier=verifier, log=_log)


def _log(message: str) -> None:
    click.echo(f"[toy] {message}", err=True)
