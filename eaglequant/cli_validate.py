"""``eaglequant validate``: option parsing and reporting only."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

PATH = click.Path(path_type=Path)


def engine_options(func: Any) -> Any:
    """``--tensor-parallel-size`` and repeatable ``--engine-arg KEY=VALUE`` (validate, tune)."""
    func = click.option(
        "--engine-arg",
        "engine_args",
        multiple=True,
        metavar="KEY=VALUE",
        help="Any other vllm EngineArgs field, e.g. max_num_seqs=8 (repeatable; JSON values).",
    )(func)
    return click.option(
        "--tensor-parallel-size",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="The target's tensor parallelism (the draft runs at 1).",
    )(func)


def parse_engine_args(engine_args: tuple[str, ...]) -> dict[str, Any]:
    from eaglequant.validate.engine_config import parse_engine_arg

    return dict(parse_engine_arg(text) for text in engine_args)


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
@click.option(
    "--max-model-len",
    type=click.IntRange(min=16),
    help="Default: 1024 on CPU, vLLM's own on GPU/ROCm.",
)
@engine_options
@click.option(
    "--lossless",
    type=click.Choice(["near-tie", "strict"]),
    default="near-tie",
    show_default=True,
    help="strict: outputs must equal the target's exactly; near-tie: a first divergence where "
    "the target's top two tokens are within --tie-margin passes.",
)
@click.option(
    "--tie-margin",
    type=click.FloatRange(min=0),
    default=0.1,
    show_default=True,
    help="Logprob gap (nats) under which the target's top two tokens count as tied.",
)
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
    max_model_len: int | None,
    tensor_parallel_size: int,
    engine_args: tuple[str, ...],
    lossless: str,
    tie_margin: float,
    json_path: Path | None,
    markdown_path: Path | None,
) -> None:
    """Run vLLM speculative decoding with the FP8 and BF16 drafts and check the FP8 one.

    Exit 0 when every check passes, 1 when one fails, 2 for bad input.
    """
    from eaglequant.cli import run_reporting_errors

    def body() -> int:
        from eaglequant.recipe import ValidationSpec
        from eaglequant.validate.engine_config import EngineOptions
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
            engine=EngineOptions(
                tensor_parallel_size=tensor_parallel_size,
                engine_args=parse_engine_args(engine_args),
                max_model_len=max_model_len,
            ),
            lossless=lossless,
            tie_margin=tie_margin,
        )
        report = run(request, progress=lambda m: click.echo(f"[eaglequant] {m}", err=True))
        if json_path:
            json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        if markdown_path:
            markdown_path.write_text(markdown_report(report))
        print_validation(report)
        return 0 if report.passed else 1

    sys.exit(run_reporting_errors(body))


def _int_list(text: str, option: str) -> tuple[int, ...]:
    from eaglequant.errors import InputError

    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError as exc:
        raise InputError(f"{option} {text!r}: give comma-separated integers, e.g. 4,6,8") from exc
    if not values or min(values) < 1:
        raise InputError(f"{option} {text!r}: values must be positive")
    return values


@click.command()
@click.option(
    "--target", type=PATH, required=True, help="Target model folder (or what vllm serve takes)."
)
@click.option("--draft", type=PATH, required=True, help="The EAGLE-3 draft to serve with.")
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
@click.option("--prompts", type=PATH, help="A .jsonl of {'prompt': ...} instead of random tokens.")
@click.option(
    "--num-prompts", type=click.IntRange(min=1), help="Requests per level (default 2x concurrency)."
)
@click.option("--serve-arg", "serve_args", multiple=True, help="Passed to vllm serve (repeatable).")
@engine_options
@click.option("--max-model-len", type=click.IntRange(min=16), help="Default: ISL + OSL + max k.")
@click.option("--out", type=PATH, default=Path("tune-results"), show_default=True)
@click.option("--server-timeout", type=float, default=600.0, show_default=True)
def tune(
    target: Path,
    draft: Path,
    ks: str,
    concurrency: str,
    isl: int,
    osl: int,
    prompts: Path | None,
    num_prompts: int | None,
    serve_args: tuple[str, ...],
    tensor_parallel_size: int,
    engine_args: tuple[str, ...],
    max_model_len: int | None,
    out: Path,
    server_timeout: float,
) -> None:
    """Sweep num_speculative_tokens across concurrency on a real vllm serve; recommend k."""
    from eaglequant.cli import run_reporting_errors

    def body() -> None:
        from eaglequant.validate.engine_config import EngineOptions
        from eaglequant.validate.tune import TuneRequest
        from eaglequant.validate.tune import tune as run

        request = TuneRequest(
            target=target,
            draft=draft,
            ks=_int_list(ks, "--k"),
            concurrencies=_int_list(concurrency, "--concurrency"),
            isl=isl,
            osl=osl,
            prompts=prompts,
            num_prompts=num_prompts,
            serve_args=tuple(a for arg in serve_args for a in arg.split()),
            engine=EngineOptions(
                tensor_parallel_size=tensor_parallel_size,
                engine_args=parse_engine_args(engine_args),
            ),
            max_model_len=max_model_len,
            out=out,
            server_timeout_s=server_timeout,
        )
        summary = run(request, progress=lambda m: click.echo(f"[eaglequant] {m}", err=True))
        click.echo((out / "results.md").read_text())
        click.echo(f"recommended k by concurrency: {summary['recommended_k']}")
        click.echo(summary["serve_command"])

    run_reporting_errors(body)
