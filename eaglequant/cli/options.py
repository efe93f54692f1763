"""Option types and option-string parsers shared by the commands.

Option strings are parsed here, in the CLI, so the library's own errors never
name a flag: a bad value is reported with the option that carried it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from eaglequant.errors import InputError

if TYPE_CHECKING:
    from eaglequant.capture.run import CaptureEngine
    from eaglequant.engine.config import EngineOptions

PATH = click.Path(path_type=Path)
EXISTING_DIR = click.Path(path_type=Path, file_okay=False)
ARGV_KEY = "eaglequant.argv"


def invocation() -> str:
    """The running command's line as given, each path option or argument a placeholder."""
    # lazy: --help latency
    from eaglequant.results.provenance import command_string, placeholder

    ctx = click.get_current_context()
    argv = ctx.meta.get(ARGV_KEY, sys.argv[1:])
    name = ctx.info_name or ctx.command.name or ""
    paths = {
        path: placeholder(name, p.name)
        for p in ctx.command.params
        if p.name and (path := _path_of(ctx.params.get(p.name))) is not None
    }
    return command_string(argv, paths)


def _path_of(value: object) -> Path | None:
    """The path a parameter's value names: a path, or a prompt source read from a file."""
    if isinstance(value, Path):
        return value
    path = getattr(value, "path", None)
    return path if isinstance(path, Path) else None


engine_per_draft_option = click.option(
    "--engine-per-draft",
    is_flag=True,
    help="Start one engine per draft (each loads the target) instead of swapping the drafts "
    "in one engine.",
)

reference_engine_option = click.option(
    "--reference-engine",
    is_flag=True,
    help="Check 1 against a target-alone engine (one more target load) instead of scoring "
    "each draft run's output teacher-forced in its own speculative engine.",
)

_TIE_MARGIN = click.option(
    "--tie-margin",
    type=click.FloatRange(min=0),
    default=0.1,  # validate.lossless.DEFAULT_TIE_MARGIN (not imported: the CLI loads lightly)
    show_default=True,
    help="Logprob gap (nats) under which a token counts as tied with the target's best.",
)
_TIE_STEPS = click.option(
    "--tie-steps",
    type=click.FloatRange(min=0),
    default=0.0,  # validate.lossless.DEFAULT_TIE_STEPS
    show_default=True,
    help="Or: gap in BF16 rounding steps of the target's best logit (check 1 teacher-forced, "
    "where the engine returns raw logits) under which a token counts as tied; 0: not used "
    "(the report records each near-tie's steps either way).",
)


def tie_margin_option(command: Any) -> Any:
    """check 1's near-tie tolerances: ``--tie-margin`` (nats) and ``--tie-steps`` (BF16 steps)."""
    return _TIE_MARGIN(_TIE_STEPS(command))


SETS_HELP = "a prompt set mt-bench, humaneval or sharegpt (NAME:N: its first N)"


class PromptsType(click.ParamType):
    """A prompts file or a named prompt set (``NAME[:N]``), as a ``PromptSource``.

    ``as_file``: a set is written out as a ``.jsonl`` of ``{"prompt": ...}`` in the cache
    and its path returned, for commands that hand a file to another program.
    """

    name = "PROMPTS"

    def __init__(self, as_file: bool = False) -> None:
        self.as_file = as_file

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # lazy: --help latency
        from eaglequant.prompts.source import PromptSource, parse_source

        source = value if isinstance(value, (PromptSource, Path)) else parse_source(str(value))
        if not self.as_file or isinstance(source, Path):
            return source
        if source.path is not None:
            return source.path
        # lazy: --help latency
        from eaglequant.prompts.source import prompts_as_file

        return prompts_as_file(source)


PROMPTS = PromptsType()
PROMPTS_FILE = PromptsType(as_file=True)


def progress(message: str) -> None:
    """A library progress line, on stderr."""
    click.echo(f"[eaglequant] {message}", err=True)


def int_list(text: str, option: str, *, minimum: int, example: str) -> tuple[int, ...]:
    """'4,6,8' -> (4, 6, 8); InputError naming ``option`` for a non-integer or a value < minimum."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError as exc:
        raise InputError(
            f"{option} {text!r}: give comma-separated integers, e.g. {example}"
        ) from exc
    if min(values) < minimum:
        raise InputError(f"{option} {text!r}: values must be at least {minimum}")
    return values


def shard_size(text: str) -> int:
    """'5GB', '500MB', '10KB' or a byte count -> bytes; InputError naming --max-shard-size."""
    # lazy: --help latency
    from huggingface_hub.serialization._base import parse_size_to_int

    if text.strip().isdigit():
        size = int(text)
    else:
        try:
            size = parse_size_to_int(text)
        except ValueError as exc:
            raise InputError(
                f"--max-shard-size {text!r}: not a size; use a byte count or e.g. 5GB, 500MB"
            ) from exc
    if size <= 0:
        raise InputError(f"--max-shard-size {text!r}: must be positive")
    return size


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


def draft_kv_cache_option(func: Any) -> Any:
    """``--draft-kv-cache-dtype`` (validate, tune, compare): the speculative ``kv_cache_dtype``."""
    # lazy: --help latency
    from eaglequant.rules.speculative import DRAFT_KV_CACHE_DTYPES

    return click.option(
        "--draft-kv-cache-dtype",
        type=click.Choice(DRAFT_KV_CACHE_DTYPES),
        help="The quantized draft's KV cache dtype, as vLLM spells it (default: the target's).",
    )(func)


def engine_settings(
    tensor_parallel_size: int, engine_args: tuple[str, ...], max_model_len: int | None = None
) -> EngineOptions:
    """The parsed ``engine_options`` (and a max model length) as the library takes them."""
    # lazy: --help latency
    from eaglequant.engine.config import EngineOptions, parse_engine_arg

    return EngineOptions(
        tensor_parallel_size=tensor_parallel_size,
        engine_args=dict(parse_engine_arg(text) for text in engine_args),
        max_model_len=max_model_len,
    )


def data_parallel_option(func: Any) -> Any:
    """``--data-parallel-size`` for commands that capture hidden states with vLLM."""
    return click.option(
        "--data-parallel-size",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="vLLM capture replicas, each on its own share of the sequences and devices/cores.",
    )(func)


def capture_engine(
    name: str | None,
    option: str,
    engine: EngineOptions,
    data_parallel_size: int = 1,
    trust_remote_code: bool = False,
) -> CaptureEngine:
    """The engine that runs the target for hidden states (``option`` names the choice)."""
    # lazy: --help latency
    from eaglequant.capture.run import CaptureEngine, default_engine

    chosen = name or default_engine()
    if chosen == "transformers" and (engine != type(engine)() or data_parallel_size > 1):
        raise InputError(
            f"--tensor-parallel-size, --data-parallel-size and --engine-arg apply to "
            f"{option} vllm; drop them or use vllm"
        )
    return CaptureEngine(
        name="vllm" if chosen == "vllm" else "transformers",
        options=engine,
        data_parallel_size=data_parallel_size,
        trust_remote_code=trust_remote_code,
    )


def engine_choice(option: str, what: str) -> Any:
    """``option`` [vllm|transformers]: which engine runs the target for ``what``."""
    return click.option(
        option,
        type=click.Choice(["vllm", "transformers"]),
        help=f"Engine that runs the target for {what} (default: vllm where installed, else "
        "transformers).",
    )


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists its options under headings (``sections``: heading ->
    parameter names), in that order; an option no section names is listed under "Other
    options", with ``--help``. Defaults are shown wherever an option has one."""

    def __init__(self, *args: Any, sections: dict[str, tuple[str, ...]], **kwargs: Any) -> None:
        kwargs.setdefault("context_settings", {}).setdefault("show_default", True)
        super().__init__(*args, **kwargs)
        self.sections = sections

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = {
            param.name: record
            for param in self.get_params(ctx)
            if (record := param.get_help_record(ctx)) is not None
        }
        for heading, names in [*self.sections.items(), ("Other options", tuple(records))]:
            rows = [records.pop(name) for name in names if name in records]
            if rows:
                with formatter.section(heading):
                    formatter.write_dl(rows)
