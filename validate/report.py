"""Validation reports: a terminal table and Markdown (the JSON is the report's own data)."""

from __future__ import annotations

from eaglequant.render.terminal import console
from eaglequant.validate.validate import ValidationReport, acceptance


def _acceptance_rows(report: ValidationReport) -> list[tuple[str, str, str, str]]:
    rows = []
    for role in ("bf16", "fp8"):
        engine = report.engines.get(role, {})
        acc = engine.get("acceptance") or acceptance({})
        mean = f"{acc['mean_length']:.3f}" if acc["mean_length"] is not None else "-"
        per_pos = " / ".join(f"{p:.3f}" for p in acc["per_position"]) or "-"
        timing = f"load {engine.get('load_s', '-')}s, generate {engine.get('generate_s', '-')}s"
        rows.append((role.upper(), mean, per_pos, timing))
    return rows


def print_validation(report: ValidationReport) -> None:
    from rich.table import Table

    console.print(
        f"target {report.target}, k={report.k}, {report.prompts} prompts x {report.max_tokens} "
        f"tokens, backend {report.backend}, "
        f"CPU FP8 plugin {'active' if report.plugin_active else 'inactive'}"
    )
    table = Table(title="Speculative decoding in vLLM")
    for column in ("draft", "mean acceptance length", "acceptance by position", "engine"):
        table.add_column(column)
    for row in _acceptance_rows(report):
        table.add_row(*row)
    console.print(table)
    checks = Table(title="Checks")
    for column in ("check", "result", "detail"):
        checks.add_column(column)
    for check in report.checks:
        checks.add_row(
            check.name, "[green]PASS[/green]" if check.passed else "[red]FAIL[/red]", check.detail
        )
    console.print(checks)
    console.print(
        "[green]all checks passed[/green]" if report.passed else "[red]validation FAILED[/red]"
    )


def markdown_report(report: ValidationReport) -> str:
    lines = [
        "## Validation in vLLM speculative decoding",
        "",
        f"Target `{report.target}`, FP8 draft `{report.draft}`, BF16 baseline `{report.baseline}`; "
        f"`num_speculative_tokens={report.k}`, {report.prompts} prompts x {report.max_tokens} "
        f"tokens, greedy, `enforce_eager`; backend {report.backend}"
        + (", CPU FP8 plugin active" if report.plugin_active else "")
        + ".",
        "",
        "| draft | mean acceptance length | acceptance by position | engine |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _acceptance_rows(report)]
    lines += ["", "| check | result | detail |", "|---|---|---|"]
    for check in report.checks:
        detail = check.detail.replace("|", "\\|")
        lines.append(f"| {check.name} | {'PASS' if check.passed else 'FAIL'} | {detail} |")
    lines += ["", f"**{'All checks passed' if report.passed else 'Validation FAILED'}.**", ""]
    return "\n".join(lines)
