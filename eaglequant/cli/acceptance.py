"""``eaglequant acceptance``: option parsing and reporting only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from eaglequant.cli.options import (
    PATH,
    PROMPTS,
    SETS_HELP,
    engine_options,
    engine_settings,
    progress,
)
from eaglequant.errors import InputError
from eaglequant.results.workload import MAX_TOKENS

if TYPE_CHECKING:
    from eaglequant.prompts.source import PromptSource


@click.command()
@click.option("--target", type=PATH, required=True, help="Target model folder.")
@click.option("--draft", type=PATH, required=True, help="The EAGLE-3 draft (BF16 or FP8).")
@click.option(
    "--prompts",
    type=PROMPTS,
    required=True,
    help=f"Prompts: .jsonl, .txt, or {SETS_HELP}.",
)
@click.option(
    "--k", type=click.IntRange(1, 16), default=3, show_default=True, help="num_speculative_tokens."
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=MAX_TOKENS,
    show_default=True,
    help="Tokens generated per prompt (EOS ignored, as validate generates).",
)
@click.option(
    "--no-chat-template",
    is_flag=True,
    help="Send the prompts raw, not through the target's chat template.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Measure runs sampled at this temperature (vLLM's rejection sampling), one per --seed.",
)
@click.option(
    "--seed",
    "seeds",
    type=click.IntRange(min=0),
    multiple=True,
    help="Sampling seed, repeatable (default with --temperature: 0).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    help="Most requests in flight (vLLM's max_num_seqs; default: every prompt at once).",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=16),
    help="Default: 1024 on CPU, vLLM's own on GPU/ROCm.",
)
@engine_options
@click.option(
    "--engine-timeout", type=float, default=600.0, show_default=True, help="Seconds for the engine."
)
@click.option("--json", "json_path", type=PATH, help="Write the typed result (JSON) here.")
def acceptance(
    target: Path,
    draft: Path,
    prompts: PromptSource,
    k: int,
    max_tokens: int,
    no_chat_template: bool,
    temperature: float,
    seeds: tuple[int, ...],
    concurrency: int | None,
    max_model_len: int | None,
    tensor_parallel_size: int,
    engine_args: tuple[str, ...],
    engine_timeout: float,
    json_path: Path | None,
) -> None:
    """Measure a draft's mean acceptance length in vLLM, labelled with its workload.

    vLLM's definition: 1 + accepted / drafts from its spec-decode counters, with a 95%
    bootstrap interval over prompts, and per position accepted there / drafts.
    Exit 0 when measured, 1 when the engine failed, 2 for bad input.
    """
    # lazy: --help latency
    from eaglequant.io.output import check_file_output, write_text_atomic
    from eaglequant.prompts.source import load_prompts
    from eaglequant.validate.acceptance_length import AcceptanceRequest, measure_acceptance

    if seeds and not temperature:
        raise InputError("--seed samples: give --temperature above 0 with it (0 is greedy)")
    if json_path is not None:
        check_file_output(json_path)
    engine = engine_settings(tensor_parallel_size, engine_args, max_model_len)
    if concurrency is not None:
        if "max_num_seqs" in engine.engine_args:
            raise InputError(
                "--concurrency and --engine-arg max_num_seqs both set the requests in flight; "
                "give one"
            )
        engine = engine_settings(
            tensor_parallel_size, (*engine_args, f"max_num_seqs={concurrency}"), max_model_len
        )
    prompt_set = load_prompts(prompts)
    request = AcceptanceRequest(
        target=target,
        draft=draft,
        prompts=prompt_set.texts,
        prompt_set=prompt_set.source,
        prompts_sha256=prompt_set.sha256,
        k=k,
        max_tokens=max_tokens,
        chat_template=not no_chat_template,
        temperature=temperature,
        sampling_seeds=(seeds or (0,)) if temperature else (),
        engine=engine,
        engine_timeout_s=engine_timeout,
    )
    measured = measure_acceptance(request, progress=progress)
    if json_path is not None:
        write_text_atomic(json_path, json.dumps(measured.to_json(), indent=2) + "\n")
    click.echo(measured.describe())
