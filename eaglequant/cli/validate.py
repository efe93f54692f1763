"""``eaglequant validate``: option parsing and reporting only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from eaglequant.cli.options import PATH


@click.command()
@click.option("--target", type=PATH, required=True, help="Target model folder.")
@click.option("--draft", type=PATH, required=True, help="The FP8 draft to validate.")
@click.option("--baseline", type=PATH, required=True, help="The BF16 draft it was exported from.")
@click.option(
    "--k", type=click.IntRange(1, 16), default=3, show_default=True, help="num_speculative_tokens."
)
@click.option("--prompts", type=PATH, help="Prompts: .jsonl (text) or .txt (one per line).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=48, show_default=True)
@click.option(
    "--min-acceptance-ratio",
    type=float,
    help="Required FP8/BF16 acceptance length (recipe default 0.98).",
)
@click.option("--scale-tolerance", type=float, help="Scale plausibility factor (recipe default 4).")
@click.option(
    "--engine-timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds per vLLM engine.",
)
@click.option("--max-model-len", type=click.IntRange(min=16), default=1024, show_default=True)
@click.option("--json", "json_path", type=PATH, help="Write the JSON report here.")
@click.option("--markdown", "markdown_path", type=PATH, help="Write the Markdown report here.")
def validate(
    target: Path,
    draft: Path,
    baseline: Path,
    k: int,
    prompts: Path | None,
    max_tokens: int,
    min_acceptance_ratio: float | None,
    scale_tolerance: float | None,
    engine_timeout: float,
    max_model_len: int,
    json_path: Path | None,
    markdown_path: Path | None,
) -> None:
    """Run vLLM speculative decoding with the FP8 and BF16 drafts and check the FP8 one.

    Exit 0 when every check passes, 1 when one fails, 2 for bad input.
    """
    from eaglequant.recipe import ValidationSpec
    from eaglequant.validate.report import markdown_report, print_validation
    from eaglequant.validate.validate import ValidateRequest, read_prompts
    from eaglequant.validate.validate import validate as run

    defaults = ValidationSpec()
    request = ValidateRequest(
        target=target,
        draft=draft,
        baseline=baseline,
        prompts=read_prompts(prompts),
        k=k,
        max_tokens=max_tokens,
        min_acceptance_ratio=min_acceptance_ratio or defaults.min_acceptance_ratio,
        scale_tolerance=scale_tolerance or defaults.scale_tolerance,
        engine_timeout_s=engine_timeout,
        max_model_len=max_model_len,
    )
    report = run(request, progress=lambda m: click.echo(f"[eaglequant] {m}", err=True))
    if json_path:
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if markdown_path:
        markdown_path.write_text(markdown_report(report))
    print_validation(report)
    sys.exit(0 if report.passed else 1)
