"""``eaglequant validate``: option parsing and reporting only."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from eaglequant.cli.options import (
    PATH,
    PROMPTS,
    SETS_HELP,
    SectionedCommand,
    draft_kv_cache_option,
    engine_choice,
    engine_options,
    engine_per_draft_option,
    engine_settings,
    invocation,
    reference_engine_option,
    tie_margin_option,
)
from eaglequant.cli.options import capture_engine as capture_engine_for
from eaglequant.errors import InputError
from eaglequant.results.workload import MAX_TOKENS

if TYPE_CHECKING:
    from eaglequant.prompts.source import PromptSource

# validate --help lists its options by what they are for.
SECTIONS = {
    "What to validate": ("target", "draft", "baseline", "k", "recipe"),
    "Prompts": (
        "prompts",
        "no_chat_template",
        "second_turns",
        "max_tokens",
        "temperature",
        "seeds",
    ),
    "Engine": (
        "tensor_parallel_size",
        "engine_args",
        "max_model_len",
        "engine_timeout",
        "draft_kv_cache_dtype",
        "draft_attention_backend",
        "engine_per_draft",
        "reference_engine",
        "capture_engine",
        "hidden_states",
    ),
    "Judging": (
        "lossless",
        "tie_margin",
        "tie_steps",
        "min_acceptance_ratio",
        "scale_tolerance",
        "against",
    ),
    "Output": ("json_path", "markdown_path", "junit_path"),
}


@click.command(cls=SectionedCommand, sections=SECTIONS)
@click.option("--target", type=PATH, required=True, help="Target model folder.")
@click.option("--draft", type=PATH, required=True, help="The FP8 draft to validate.")
@click.option("--baseline", type=PATH, required=True, help="The BF16 draft it was exported from.")
@click.option(
    "--k", type=click.IntRange(1, 16), default=3, show_default=True, help="num_speculative_tokens."
)
@click.option(
    "--prompts",
    type=PROMPTS,
    required=True,
    help=f"Prompts: .jsonl (text, prompt or turns; optional category), .txt (one per line), or "
    f"{SETS_HELP}, installed with `eaglequant prompts fetch`.",
)
@click.option(
    "--no-chat-template",
    is_flag=True,
    help="Send the prompts raw, not through the target's chat template (used when it has one).",
)
@click.option(
    "--second-turns",
    is_flag=True,
    help="Also measure each prompt's second turn (MT-Bench's, a .jsonl record's second of "
    "'turns'), asked after the target's own greedy answer to the first (generated once, "
    "before the measured runs, stopping at EOS or --max-tokens) through its chat template, and "
    "counted in the prompt's category; prompts without one are measured as they are.",
)
@click.option("--max-tokens", type=click.IntRange(min=1), default=MAX_TOKENS, show_default=True)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Judge checks 2 and 5 on runs sampled at this temperature, as served (vLLM verifies "
    "the drafts by rejection sampling), one per --seed after each draft's greedy run; check 1 "
    "stays greedy. 0: greedy only.",
)
@click.option(
    "--seed",
    "seeds",
    type=click.IntRange(min=0),
    multiple=True,
    help="Sampling seed, repeatable (default with --temperature: 0): one sampled run per draft "
    "and seed; the intervals resample prompts, each prompt's counts summed over the seeds.",
)
@click.option(
    "--recipe",
    help="Recipe whose validation thresholds apply (default: the one the draft was exported "
    "with, from its manifest; else fp8-static).",
)
@click.option(
    "--min-acceptance-ratio",
    type=click.FloatRange(0, 1.5, min_open=True),
    help="Required FP8/BF16 acceptance length ratio (overrides the recipe's).",
)
@click.option(
    "--scale-tolerance",
    type=click.FloatRange(1, min_open=True),
    help="Scale plausibility factor (overrides the recipe's).",
)
@click.option(
    "--engine-timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds per vLLM engine.",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=16),
    help="Default: 1024 on CPU, vLLM's own on GPU/ROCm.",
)
@engine_options
@draft_kv_cache_option
@click.option(
    "--draft-attention-backend",
    metavar="NAME",
    help="vLLM's attention backend for both drafts, e.g. CPU_MLA (default: vLLM picks for the "
    "draft; it never inherits the target's).",
)
@engine_choice("--capture-engine", "check 6's hidden states")
@click.option(
    "--hidden-states",
    type=PATH,
    help="Check 6 reads the target's states from this capture folder instead of running it.",
)
@click.option(
    "--lossless",
    type=click.Choice(["paired", "near-tie", "strict"]),
    default="paired",  # validate.lossless.DEFAULT_MODE
    show_default=True,
    help="strict: outputs must equal the target's exactly; near-tie: a token within "
    "--tie-margin of the target's best passes; paired: the BF16 draft's run is the control "
    "(the target's verify-against-prefill noise): a flip it made too after the same prefix "
    "passes, and other flips pass while the FP8 run flips no more often than the control "
    "(one-sided binomial test at 0.001) and none is over 1 nat (teacher-forced check 1 only).",
)
@tie_margin_option
@engine_per_draft_option
@reference_engine_option
@click.option(
    "--against",
    type=PATH,
    help="An earlier validation report (--json): fail if this FP8 draft's acceptance dropped "
    "beyond noise and the recipe's max_regression (check 7).",
)
@click.option("--json", "json_path", type=PATH, help="Write the JSON report here.")
@click.option("--markdown", "markdown_path", type=PATH, help="Write the Markdown report here.")
@click.option(
    "--junit-xml", "junit_path", type=PATH, help="Write JUnit XML here (one test case per check)."
)
def validate(
    target: Path,
    draft: Path,
    baseline: Path,
    k: int,
    prompts: PromptSource,
    no_chat_template: bool,
    second_turns: bool,
    max_tokens: int,
    temperature: float,
    seeds: tuple[int, ...],
    recipe: str | None,
    min_acceptance_ratio: float | None,
    scale_tolerance: float | None,
    engine_timeout: float,
    max_model_len: int | None,
    tensor_parallel_size: int,
    engine_args: tuple[str, ...],
    draft_kv_cache_dtype: str | None,
    draft_attention_backend: str | None,
    capture_engine: str | None,
    hidden_states: Path | None,
    lossless: str,
    tie_margin: float,
    tie_steps: float,
    engine_per_draft: bool,
    reference_engine: bool,
    against: Path | None,
    json_path: Path | None,
    markdown_path: Path | None,
    junit_path: Path | None,
) -> None:
    """Run vLLM speculative decoding with the FP8 and BF16 drafts and check the FP8 one.

    Exit 0 when every check passes, 1 when one fails or is inconclusive, 2 for bad input.
    """
    # lazy: --help latency
    from eaglequant.io.output import check_file_output, write_text_atomic
    from eaglequant.prompts.source import load_prompts
    from eaglequant.render.junit import junit_xml
    from eaglequant.render.terminal import print_validation
    from eaglequant.render.validation_tables import validation_markdown
    from eaglequant.validate.regression import read_previous
    from eaglequant.validate.request import ValidateRequest, validation_spec
    from eaglequant.validate.validation import validate_draft as run

    if seeds and not temperature:
        raise InputError("--seed samples: give --temperature above 0 with it (0 is greedy)")
    for path in filter(None, (json_path, markdown_path, junit_path)):
        check_file_output(path)
    thresholds = validation_spec(draft, recipe)
    prompt_set = load_prompts(prompts)
    if second_turns and prompt_set.followups is None:
        raise InputError(
            f"{prompts}: no prompt has a second turn; --second-turns needs a set with them "
            "(mt-bench) or a .jsonl whose records have two 'turns'"
        )
    request = ValidateRequest(
        target=target,
        draft=draft,
        baseline=baseline,
        prompts=prompt_set.texts,
        categories=prompt_set.categories,
        followups=prompt_set.followups if second_turns else None,
        prompt_set=prompt_set.describe(),
        chat_template=not no_chat_template,
        min_category_drafts=thresholds.min_category_drafts,
        k=k,
        max_tokens=max_tokens,
        temperature=temperature,
        sampling_seeds=(seeds or (0,)) if temperature else (),
        min_acceptance_ratio=(
            thresholds.min_acceptance_ratio
            if min_acceptance_ratio is None
            else min_acceptance_ratio
        ),
        scale_tolerance=thresholds.scale_tolerance if scale_tolerance is None else scale_tolerance,
        min_position_ratio=thresholds.min_position_ratio,
        max_regression=thresholds.max_regression,
        engine_timeout_s=engine_timeout,
        engine=engine_settings(tensor_parallel_size, engine_args, max_model_len),
        lossless=lossless,
        tie_margin=tie_margin,
        tie_steps=tie_steps,
        capture=capture_engine_for(
            capture_engine, "--capture-engine", engine_settings(tensor_parallel_size, engine_args)
        ),
        hidden_states=hidden_states,
        engine_per_draft=engine_per_draft,
        reference_engine=reference_engine,
        draft_kv_cache_dtype=draft_kv_cache_dtype,
        draft_attention_backend=draft_attention_backend,
        against=read_previous(against) if against else None,
        command=invocation(),
    )
    report = run(request, progress=lambda m: click.echo(f"[eaglequant] {m}", err=True))
    if json_path:
        write_text_atomic(json_path, json.dumps(report.to_json(), indent=2) + "\n")
    if markdown_path:
        write_text_atomic(markdown_path, validation_markdown(report))
    if junit_path:
        write_text_atomic(junit_path, junit_xml([report]))
    print_validation(report)
    sys.exit(0 if report.passed else 1)
