"""Terminal rendering of reports with rich tables (imported only by the commands that print)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from eaglequant.render.validation_tables import (
    CATEGORY_COLUMNS,
    acceptance_rows,
    category_rows,
    prompts_line,
    workload_line,
)
from eaglequant.results.validation_report import ValidationReport
from eaglequant.rules.inspection import InspectReport

VERDICT_STYLES = {"PASS": "green", "FAIL": "red", "INCONCLUSIVE": "yellow"}
VERDICT_LINES = {
    "PASS": "all checks passed",
    "FAIL": "validation FAILED",
    "INCONCLUSIVE": "validation INCONCLUSIVE: too few prompts to decide",
}

# Into a pipe or a log: tables laid out 160 wide, text lines never wrapped (a path or a command
# in a problem line stays whole, to be pasted or grepped).
_TTY = sys.stdout.isatty()
console = Console(highlight=False, width=None if _TTY else 160, soft_wrap=not _TTY)


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    raise AssertionError("unreachable")


def print_inspect(report: InspectReport) -> None:
    console.print(f"[bold]{report.path}[/bold]  architectures={report.architectures}")
    console.print(f"form: {report.form}")
    if report.dims:
        dims = report.dims
        fc_in = dims.num_aux * dims.target_hidden
        console.print(
            f"hidden {dims.hidden}, heads {dims.heads}/{dims.kv_heads} x "
            f"{dims.head_dim}, intermediate {dims.intermediate}, "
            f"fc {fc_in}->{dims.hidden}, "
            f"vocab {dims.vocab} (draft {dims.draft_vocab}), "
            f"aux layers {dims.aux_layer_ids}"
        )
    sizes = ", ".join(f"{k} {human_bytes(v)}" for k, v in report.bytes_by_dtype.items())
    console.print(f"{report.tensor_count} tensors ({sizes}) in {len(report.shards)} file(s)")
    quant = report.quantization
    if quant:
        line = f"quantization: {quant.summary} {quant.version or ''}".rstrip()
        if quant.exclusion_key:
            line += f" ({quant.method}); vLLM reads {quant.exclusion_key}={quant.exclusions}"
        if quant.kv_cache_group is not None:
            line += f" kv_cache_group={quant.kv_cache_group}"
        console.print(line)
    else:
        console.print("quantization: none")
    if report.size is not None:
        size = report.size
        console.print(
            f"size: {size.bytes_on_disk} bytes of tensors; {size.quantized_parameters} of "
            f"{size.parameters} parameters quantized ({size.quantized_fraction:.1%})"
        )
    table = Table(title="How vLLM will build each draft linear (on a GPU)")
    for column in ("vLLM module", "checkpoint", "linear method", "scheme", "weights", "why"):
        table.add_column(column, overflow="fold")
    for fate in report.fates:
        table.add_row(
            fate.vllm_name,
            ", ".join(fate.checkpoint_names),
            fate.built_as,
            fate.scheme,
            fate.weight_dtype,
            fate.reason + (f"; CPU: {fate.cpu}" if fate.cpu else ""),
        )
    console.print(table)
    if report.problems:
        console.print(f"[red]{len(report.problems)} problem(s):[/red]")
        for problem in report.problems:
            console.print(f"  - {problem}")
    else:
        console.print("[green]no problems found[/green]")


def print_export(result) -> None:  # type: ignore[no-untyped-def]
    """The plan (dry run) or the closing summary of an export."""
    if result.dry_run:
        console.print("[bold]dry run[/bold]: every check passed; the export would:")
        for step in result.plan.steps:
            console.print(f"  - {step}")
        return
    manifest = result.manifest
    assert manifest is not None  # an export that ran writes one
    calib = manifest["calibration"]
    table = Table(title=f"FP8 layers written to {result.out}")
    for column in ("layer", "w amax", "w scale", "in range", "in scale", "SQNR dB"):
        table.add_column(column, justify="right" if column != "layer" else "left")
    for layer in manifest["layers"]:
        table.add_row(
            layer["name"],
            _num(layer["weight_amax"]),
            _num(layer["weight_scale"]),
            _num(layer["input_amax"]),
            _num(layer["input_scale"]) if layer["input_scale"] is not None else "dynamic",
            f"{layer['sqnr_db']:.1f}" if layer["sqnr_db"] is not None else "-",
        )
    console.print(table)
    agreement = manifest["top1_agreement_by_step"]
    if agreement:
        steps = ", ".join(f"step {k + 1}: {a:.3f}" for k, a in enumerate(agreement))
        console.print(f"top-1 agreement FP8 vs BF16 draft on held-out inputs: {steps}")
    if not calib["calibrated"]:
        console.print("[yellow]input scales were NOT calibrated (--calib none)[/yellow]")
    else:
        console.print(f"calibration: {calib['source']}, {calib['tokens']} tokens")
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in manifest["timings_s"].items())
    console.print(f"timings: {timings}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def engines_line(report: ValidationReport) -> str:
    """How the engines ran: the mode, target loads, seconds loading against generating (and,
    of that, scoring check 1 teacher-forced)."""
    scoring = f", {report.score_s:.1f}s of it scoring" if report.score_s else ""
    return (
        f"engines: {report.engine_mode}, target loaded {report.target_loads}x "
        f"({report.load_s:.1f}s loading in engines, {report.generate_s:.1f}s generating"
        f"{scoring})"
    )


def print_validation(report: ValidationReport) -> None:
    """A validation report: setup, acceptance, checks, verdict, serve line."""
    console.print(
        f"target {report.target}, k={report.k}, {report.prompts} prompts x "
        f"{report.max_tokens} tokens, backend {report.backend}, "
        f"CPU FP8 plugin {'active' if report.plugin_active else 'inactive'}"
    )
    console.print(prompts_line(report).replace("**", "").replace("`", ""))
    table = Table(title="Speculative decoding in vLLM")
    for column in ("draft", "mean acceptance length", "acceptance by position", "engine"):
        table.add_column(column)
    for row in acceptance_rows(report):
        table.add_row(*row)
    console.print(table)
    console.print(workload_line(report))
    categories = category_rows(report.categories)
    if categories:
        by_category = Table(title="By prompt category")
        for column in CATEGORY_COLUMNS:
            by_category.add_column(column)
        for category in categories:
            by_category.add_row(*category)
        console.print(by_category)
    console.print(engines_line(report))
    checks = Table(title="Checks")
    for column in ("check", "result", "detail"):
        checks.add_column(column)
    for check in report.checks:
        style = VERDICT_STYLES[check.verdict]
        checks.add_row(check.name, f"[{style}]{check.verdict}[/{style}]", check.detail)
    console.print(checks)
    style = VERDICT_STYLES[report.verdict]
    line = VERDICT_LINES[report.verdict]
    if report.verdict == "PASS" and report.undecided_categories:
        line = "passed; undecided by category (too few prompts each): " + ", ".join(
            report.undecided_categories
        )
    console.print(f"[{style}]{line}[/{style}]")
    if report.serve_command:
        console.print(f"equivalent serve line: {report.serve_command}", soft_wrap=True)
