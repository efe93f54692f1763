"""``eaglequant tune``: option parsing and reporting only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from eaglequant.cli.options import (
    PATH,
    PROMPTS,
    draft_kv_cache_option,
    engine_options,
    engine_settings,
    int_list,
    invocation,
)
from eaglequant.errors import InputError

if TYPE_CHECKING:
    from eaglequant.prompts.source import PromptSource


@click.command()
@click.option(
    "--target", type=PATH, required=True, help="Target model folder (or what vllm serve takes)."
)
@click.option("--draft", type=PATH, required=True, help="The EAGLE-3 draft to serve with.")
@click.option(
    "--baseline",
    type=PATH,
    help="Compare --draft against this draft (e.g. the BF16 one) and no speculation, "
    "under the same serve arguments in rotated rounds, instead of sweeping k.",
)
@click.option(
    "--keep-servers",
    is_flag=True,
    help="With --baseline: start each configuration's server once and keep all alive "
    "(needs memory for all at once); default: restart them in every round.",
)
@click.option(
    "--k", "ks", default="4,6,8", show_default=True, help="num_speculative_tokens values."
)
@click.option(
    "--concurrency", default="4,8,16,32,64", show_default=True, help="Concurrency levels."
)
@click.option(
    "--isl", type=click.IntRange(min=1), default=1024, show_default=True, help="Input length."
)
@click.option(
    "--osl", type=click.IntRange(min=1), default=1024, show_default=True, help="Output length."
)
@click.option(
    "--prompts",
    type=PROMPTS,
    help="A .jsonl of {'prompt': ...}, or a prompt set (mt-bench, humaneval, sharegpt[:N]), "
    "instead of random tokens (with --dataset sharegpt: a ShareGPT .json, or the set sharegpt).",
)
@click.option(
    "--dataset",
    type=click.Choice(["random", "custom", "sharegpt"]),
    help="vllm bench serve's dataset (default: custom with --prompts, else random).",
)
@click.option(
    "--num-prompts", type=click.IntRange(min=1), help="Requests per level (default 2x concurrency)."
)
@click.option(
    "--chat-template",
    is_flag=True,
    help="Send --prompts through the target's chat template (vllm bench serve applies it), as "
    "validate and acceptance send them.",
)
@click.option(
    "--ignore-eos",
    is_flag=True,
    help="Generate every answer to --osl tokens, as validate does (the random dataset always "
    "does).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Rounds per point, inside each server after its warm-up (--baseline: across "
    "restarted servers); a k wins only beyond their spread.",
)
@click.option(
    "--schedule",
    metavar="JSON",
    help="Measure this num_speculative_tokens_per_batch_size, e.g. '[[1,4,6],[5,64,3]]', "
    "instead of the one built from the winners.",
)
@click.option(
    "--predict",
    is_flag=True,
    help="Serve no speculation and the largest k, predict every other point, then serve one "
    "confirmation of the predicted recommendation (3 server starts; with --baseline: no "
    "speculation and both drafts at the largest k, then both at the predicted k, 5).",
)
@click.option("--serve-arg", "serve_args", multiple=True, help="Passed to vllm serve (repeatable).")
@engine_options
@draft_kv_cache_option
@click.option(
    "--max-model-len", type=click.IntRange(min=16), help="Default: ISL + OSL + 2 x max k."
)
@click.option("--out", type=PATH, default=Path("tune-results"), show_default=True)
@click.option("--server-timeout", type=float, default=600.0, show_default=True)
def tune(
    target: Path,
    draft: Path,
    baseline: Path | None,
    keep_servers: bool,
    ks: str,
    concurrency: str,
    isl: int,
    osl: int,
    prompts: PromptSource | Path | None,
    dataset: str | None,
    num_prompts: int | None,
    chat_template: bool,
    ignore_eos: bool,
    repeats: int,
    schedule: str | None,
    predict: bool,
    serve_args: tuple[str, ...],
    tensor_parallel_size: int,
    engine_args: tuple[str, ...],
    draft_kv_cache_dtype: str | None,
    max_model_len: int | None,
    out: Path,
    server_timeout: float,
) -> None:
    """Sweep num_speculative_tokens across concurrency on a real vllm serve; recommend what won.

    Every point is measured --repeats times; a k wins at a concurrency only when its slowest
    repeat beats no speculation's fastest. The per-concurrency winners become one
    per-batch-size schedule, served and measured too, and recommended where it held.
    With --baseline: the release table, the draft against the baseline draft and no
    speculation at every k and concurrency.
    """
    # lazy: --help latency
    from eaglequant.prompts.source import bench_dataset_file
    from eaglequant.tune.request import KEEP, RESTART, TuneRequest

    if keep_servers and baseline is None:
        raise InputError("--keep-servers applies to --baseline; add --baseline or drop it")
    if chat_template and (prompts is None or (dataset or "custom") != "custom"):
        raise InputError("--chat-template applies to --prompts sent as the custom dataset")
    request = TuneRequest(
        target=target,
        draft=draft,
        baseline=baseline,
        servers=KEEP if keep_servers else RESTART,
        ks=int_list(ks, "--k", minimum=1, example="4,6,8"),
        concurrencies=int_list(concurrency, "--concurrency", minimum=1, example="4,8,16"),
        isl=isl,
        osl=osl,
        prompts=bench_dataset_file(prompts, dataset) if prompts is not None else None,
        prompts_source=None if prompts is None else str(prompts),
        dataset=dataset,
        num_prompts=num_prompts,
        chat_template=chat_template,
        ignore_eos=ignore_eos,
        repeats=repeats,
        schedule=None if schedule is None else _schedule(schedule),
        serve_args=tuple(a for arg in serve_args for a in arg.split()),
        engine=engine_settings(tensor_parallel_size, engine_args, max_model_len),
        out=out,
        server_timeout_s=server_timeout,
        draft_kv_cache_dtype=draft_kv_cache_dtype,
        command=invocation(),
        predict=predict,
    )

    def progress(message: str) -> None:
        click.echo(f"[eaglequant] {message}", err=True)

    if baseline is not None:
        # lazy: --help latency
        from eaglequant.tune.baseline import compare

        comparison = compare(request, progress=progress)
        click.echo((out / "results.md").read_text())
        click.echo(f"recommended: {comparison['recommendation']['text']}")
        return
    # lazy: --help latency
    from eaglequant.render.reports import recommendation_name
    from eaglequant.tune.sweep import tune as run

    summary = run(request, progress=progress)
    click.echo((out / "results.md").read_text())
    click.echo(f"winner by concurrency (0: no speculation): {summary['recommended_k']}")
    click.echo(f"recommended: {recommendation_name(summary)}")
    click.echo(summary["serve_command"])


def _schedule(text: str) -> tuple[tuple[int, int, int], ...]:
    """'[[1,4,6],[5,64,3]]' -> ((1, 4, 6), (5, 64, 3)); InputError naming --schedule."""
    try:
        ranges = json.loads(text)
        return tuple((int(a), int(b), int(k)) for a, b, k in ranges)
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise InputError(
            f"--schedule {text!r}: give a JSON list of [first batch size, last, k], "
            "e.g. [[1,4,6],[5,64,3]]"
        ) from exc
