"""Terminal rendering of reports with rich tables (imported only by the commands that print)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from eaglequant.inspect_draft import InspectReport

console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    raise AssertionError("unreachable")


def print_inspect(report: InspectReport) -> None:
    console.print(f"[bold]{report.path}[/bold]  architectures={report.architectures}")
    if report.dims:
        dims = report.dims
        console.print(
            f"hidden {dims['hidden']}, heads {dims['heads']}/{dims['kv_heads']} x {dims['head_dim']}, "
            f"intermediate {dims['intermediate']}, fc {dims['num_aux'] * dims['target_hidden']}->{dims['hidden']}, "
            f"vocab {dims['vocab']} (draft {dims['draft_vocab']}), aux layers {dims['aux_layer_ids']}"
        )
    sizes = ", ".join(f"{k} {human_bytes(v)}" for k, v in report.bytes_by_dtype.items())
    console.print(f"{report.tensor_count} tensors ({sizes}) in {len(report.shards)} file(s)")
    quant = report.quantization
    if quant:
        console.print(
            f"quantization: {quant['quant_method']} {quant['version'] or ''} "
            f"exclude={quant['exclude']} kv_cache_group={quant['kv_cache_group']}"
        )
    else:
        console.print("quantization: none")
    table = Table(title="How vLLM will build each draft linear")
    for column in ("vLLM module", "checkpoint", "quantized", "scheme", "why"):
        table.add_column(column)
    for fate in report.fates:
        table.add_row(
            fate.vllm_name,
            ", ".join(fate.checkpoint_names),
            "yes" if fate.quantized else "no",
            fate.scheme,
            fate.reason,
        )
    console.print(table)
    if report.problems:
        console.print(f"[red]{len(report.problems)} problem(s):[/red]")
        for problem in report.problems:
            console.print(f"  - {problem}")
    else:
        console.print("[green]no problems found[/green]")
