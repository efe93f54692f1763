"""Markdown for the measured reports: validation (``validate --json``) and tuning (``tune``).

Both are rendered from their JSON form, so ``validate --markdown``, tune's
``results.md`` and the model card print the same tables from the same data.
"""

from __future__ import annotations

import json
from typing import Any

PLOTS = ("throughput.png", "speedup.png", "acceptance.png")
COMPARE_JSON, COMPARE_MD = "compare.json", "compare.md"  # in ``eaglequant compare --out``


def acceptance_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(draft, mean acceptance length, by position, engine timings) for BF16 and FP8."""
    rows = []
    for role in ("bf16", "fp8"):
        engine = report["engines"].get(role, {})
        acc = engine.get("acceptance") or {}
        mean = acc.get("mean_length")
        per_pos = " / ".join(f"{p:.3f}" for p in acc.get("per_position", [])) or "-"
        timing = f"load {engine.get('load_s', '-')}s, generate {engine.get('generate_s', '-')}s"
        rows.append((role.upper(), "-" if mean is None else f"{mean:.3f}", per_pos, timing))
    return rows


def validation_markdown(report: dict[str, Any], heading: str = "##") -> str:
    """The validation report: setup, acceptance table, checks, verdict, serve line."""
    llm = report["engines"].get("fp8", {}).get("engine_config", {}).get("llm", {})
    lines = [
        f"{heading} Validation in vLLM speculative decoding (`eaglequant validate`)",
        "",
        f"Target `{report['target']}`, FP8 draft `{report['draft']}`, BF16 baseline "
        f"`{report['baseline']}`; `num_speculative_tokens={report['k']}`, {report['prompts']} "
        f"prompts x {report['max_tokens']} tokens, greedy"
        + (", `enforce_eager`" if llm.get("enforce_eager") else "")
        + f"; backend {report['backend']}"
        + (", CPU FP8 plugin active" if report["plugin_active"] else "")
        + ".",
        "",
    ]
    if report.get("serve_command"):
        lines += [f"Equivalent serve line: `{report['serve_command']}`", ""]
    config = report["engines"].get("fp8", {}).get("engine_config")
    if config:
        env = ", ".join(f"`{k}={v}`" for k, v in sorted(config["env"].items())) or "none"
        lines += [f"vLLM {config['vllm']}; environment: {env}.", ""]
    lines += ["| draft | mean acceptance length | acceptance by position | engine |"]
    lines += ["|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in acceptance_rows(report)]
    lines += ["", "| check | result | detail |", "|---|---|---|"]
    for check in report["checks"]:
        detail = check["detail"].replace("|", "\\|")
        lines.append(f"| {check['name']} | {'PASS' if check['passed'] else 'FAIL'} | {detail} |")
    verdict = "All checks passed" if report["passed"] else "Validation FAILED"
    return "\n".join([*lines, "", f"**{verdict}.**", ""])


def tune_markdown(summary: dict[str, Any]) -> str:
    """Throughput by concurrency and configuration, schedule, recommendation, acceptance."""
    schedule = summary["schedule"]
    header = ["concurrency", *(config_name(k) for k in [0, *summary["ks"]])]
    header += ["schedule"] * bool(schedule["results"]) + ["winner"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for concurrency in summary["concurrencies"]:
        points = [point(summary, k, concurrency) for k in [0, *summary["ks"]]]
        points += [point(summary, None, concurrency)] * bool(schedule["results"])
        winner = config_name(summary["recommended_k"][str(concurrency)])
        lines.append("| " + " | ".join([str(concurrency), *map(_cell, points), winner]) + " |")
    lines += ["", *_tune_notes(summary), ""]
    lines += ["| k | mean acceptance length | acceptance by position |", "|---|---|---|"]
    for k in summary["ks"]:
        rows = [r for r in summary["results"] if r["k"] == k and r["acceptance_length"] is not None]
        if not rows:
            continue
        mean = sum(r["acceptance_length"] for r in rows) / len(rows)
        per_pos = mean_positions([r["per_position"] for r in rows])
        lines.append(f"| {k} | {mean:.3f} | {' / '.join(f'{p:.3f}' for p in per_pos)} |")
    return "\n".join(lines) + "\n"


def config_name(k: int) -> str:
    return f"k={k}" if k else "no spec"


def point(summary: dict[str, Any], k: int | None, concurrency: int) -> dict[str, Any] | None:
    """The result row of single k ``k`` (None: the schedule's server) at one concurrency."""
    rows = summary["schedule"]["results"] if k is None else summary["results"]
    return next(
        (r for r in rows if r["concurrency"] == concurrency and (k is None or r["k"] == k)), None
    )


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    text = (
        f"{row['output_throughput']:.1f} [{row['throughput_min']:.1f}-{row['throughput_max']:.1f}]"
    )
    if row["k"] == 0 and not row["schedule"]:
        return text
    return f"{text} ({row['speedup']:.2f}x)"


def _tune_notes(summary: dict[str, Any]) -> list[str]:
    repeats = summary["repeats"]
    notes = [
        f"Output tokens/s, mean of {repeats} repeat(s) [slowest-fastest] (speedup over no "
        "speculation). One configuration beats another only when its slowest repeat is faster "
        "than the other's fastest; otherwise they tie and the smaller k wins."
    ]
    if repeats == 1:
        notes[0] += " With 1 repeat no spread is measured: every difference counts as real."
    schedule = summary["schedule"]
    ranges = json.dumps(schedule["ranges"])
    status = (
        "measured (column *schedule*)"
        if schedule["measured"]
        else f"not served: {schedule['not_measured_because']}"
    )
    origin = (
        "given"
        if schedule["given"]
        else "ranges of batch size, each taking the winner at the smallest measured "
        "concurrency at or above it"
    )
    notes += [
        "",
        f"Schedule `num_speculative_tokens_per_batch_size` {ranges} ({origin}): "
        f"{status}. Best single k: {config_name(summary['best_single_k'])}.",
        "",
        f"**Recommended: {recommendation_name(summary)}** ({summary['recommendation']['reason']}).",
    ]
    return notes


def recommendation_name(summary: dict[str, Any]) -> str:
    choice = summary["recommendation"]
    if choice["schedule"]:
        return f"the schedule {json.dumps(summary['schedule']['ranges'])}"
    return "no speculation" if choice["k"] == 0 else f"k={choice['k']} at every concurrency"


def mean_positions(lists: list[list[float]]) -> list[float]:
    """Acceptance rate by draft position, averaged over several measurements of one k."""
    width = max(len(values) for values in lists)
    sums = [0.0] * width
    for values in lists:
        for i, value in enumerate(values):
            sums[i] += value
    return [s / len(lists) for s in sums]


def compare_markdown(report: dict[str, Any], heading: str = "##") -> str:
    """``compare``'s table: one row per candidate against the BF16 draft, the recommendation."""
    bf16 = report["baseline_mean_acceptance"]
    bf16_pos = " / ".join(f"{p:.3f}" for p in report["baseline_per_position"]) or "-"
    lines = [
        f"{heading} Which format to ship (`eaglequant compare`)",
        "",
        f"BF16 draft `{report['baseline']}` ({report['baseline_bytes']} bytes) on target "
        f"`{report['target']}`; `num_speculative_tokens={report['k']}`, {report['prompts']} "
        f"prompts x {report['max_tokens']} tokens, greedy. BF16 mean acceptance length "
        f"{_num(bf16)}, by position {bf16_pos}.",
        "",
        "| recipe | format | draft KV cache | bytes | vs BF16 | params quantized | lossless "
        "| mean acceptance | by position | vs BF16 | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        per_pos = " / ".join(f"{p:.3f}" for p in row["per_position"]) or "-"
        verdict = "PASS" if row["passed"] else "FAIL (" + ", ".join(row["failed_checks"]) + ")"
        lines.append(
            f"| `{row['recipe']}` | {row['scheme']} | {row['kv_cache_dtype']} | "
            f"{row['bytes_on_disk']} | {row['bytes_ratio']:.3f} | "
            f"{row['quantized_fraction']:.1%} | {'yes' if row['lossless'] else 'NO'} | "
            f"{_num(row['mean_acceptance'])} | {per_pos} | {_num(row['acceptance_ratio'])} "
            f"(>= {row['min_acceptance_ratio']}) | {verdict} |"
        )
    chosen = report["recommended"]
    closing = (
        f"**Recommended: `{chosen}`** (the smallest passing candidate; on equal size, the "
        "better mean acceptance)."
        if chosen
        else "**No candidate passed.**"
    )
    return "\n".join([*lines, "", closing, ""])


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
