"""Markdown for tuning (``tune``): ``results.md`` and the model card print the same tables
from the same data. The validation report's tables: :mod:`eaglequant.render.validation_tables`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from eaglequant.render.prediction import prediction_markdown
from eaglequant.results.environment import environment_markdown
from eaglequant.results.tune_summary import (
    BASELINE,
    COMPARISON,
    DRAFT,
    NO_SPECULATION,
    ComparisonSummary,
    Point,
    SweepRow,
    SweepSummary,
    as_comparison,
    as_sweep,
    check_summary,
)
from eaglequant.results.workload import AcceptanceWorkload

PLOTS = ("throughput.png", "speedup.png", "acceptance.png")


def tune_markdown(summary: Mapping[str, Any]) -> str:
    """Tune's results (a sweep or a baseline comparison) as Markdown, with the environment.

    An older or foreign results.json is refused in one line (``InputError``).
    """
    if check_summary(summary) == COMPARISON:
        return comparison_markdown(as_comparison(summary))
    sweep = as_sweep(summary)
    text = sweep_markdown(sweep)
    prediction = sweep.get("prediction")
    if prediction:
        text += "\n" + prediction_markdown(prediction)
    environment = sweep.get("environment")
    if environment:
        text += "\nEnvironment:\n\n" + environment_markdown(environment)
    return text


def sweep_markdown(summary: SweepSummary) -> str:
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
        rows = [
            (length, r["per_position"])
            for r in summary["results"]
            if r["k"] == k and (length := r["acceptance_length"]) is not None
        ]
        if not rows:
            continue
        mean = sum(length for length, _ in rows) / len(rows)
        per_pos = mean_positions([positions for _, positions in rows])
        lines.append(f"| {k} | {mean:.3f} | {' / '.join(f'{p:.3f}' for p in per_pos)} |")
    lines += _workload_lines(summary)
    return "\n".join(lines) + "\n"


def _workload_lines(summary: SweepSummary) -> list[str]:
    """The workload of every run averaged into the acceptance table (none in older results)."""
    labels = [w for r in summary["results"] if (w := r.get("workload"))]
    if not labels:
        return []
    lines = ["", "Each row is the mean over its concurrencies; the runs' acceptance workloads:", ""]
    return lines + [f"- {AcceptanceWorkload.from_json(w).describe()}" for w in labels]


def config_name(k: int) -> str:
    return f"k={k}" if k else "no speculation"


def point(summary: SweepSummary, k: int | None, concurrency: int) -> SweepRow | None:
    """The result row of single k ``k`` (None: the schedule's server) at one concurrency."""
    rows = summary["schedule"]["results"] if k is None else summary["results"]
    return next(
        (r for r in rows if r["concurrency"] == concurrency and (k is None or r["k"] == k)), None
    )


def _cell(row: SweepRow | None) -> str:
    if row is None:
        return "-"
    text = (
        f"{row['output_throughput']:.1f} [{row['throughput_min']:.1f}-{row['throughput_max']:.1f}]"
    )
    if row["k"] == 0 and not row["schedule"]:
        return text
    return f"{text} ({row['speedup']:.2f}x)"


def _tune_notes(summary: SweepSummary) -> list[str]:
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


def recommendation_name(summary: SweepSummary) -> str:
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


def number_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def folder_name(path: str) -> str:
    """A folder by its name alone: the table goes into cards, which name no local path."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def comparison_markdown(summary: ComparisonSummary) -> str:
    """The release table per k, what made it controlled, details, serve lines, environment."""
    unit = summary["device_unit"]
    lines: list[str] = []
    for k in summary["ks"]:
        lines += [f"**k={k}** (`num_speculative_tokens`), output tokens/s per {unit}:", ""]
        lines += [*comparison_table(summary, k), ""]
    lines += [f"**Recommended: {summary['recommendation']['text']}.**", ""]
    lines += [controlled_text(summary), ""]
    lines += _comparison_details(summary)
    lines += ["", "Serve lines (identical but for `--speculative-config`):", ""]
    lines += [f"- {s['label']}: `{s['line']}`" for s in summary["serve_lines"]]
    lines += ["", "Environment:", "", environment_markdown(summary["environment"])]
    return "\n".join(lines)


def comparison_table(summary: ComparisonSummary, k: int) -> list[str]:
    """concurrency | no speculation | baseline (x) | draft (x) | acceptance | verdict."""
    unit = summary["device_unit"]
    lines = [
        f"| concurrency | {NO_SPECULATION} tok/s per {unit} | {BASELINE} (x {NO_SPECULATION}) "
        f"| {DRAFT} (x {NO_SPECULATION}) | acceptance length {BASELINE} / {DRAFT} | verdict |",
        "|---|---|---|---|---|---|",
    ]
    devices = summary["devices"]
    for level in summary["concurrencies"]:
        none = comparison_point(summary, NO_SPECULATION, 0, level)
        base = comparison_point(summary, BASELINE, k, level)
        draft = comparison_point(summary, DRAFT, k, level)
        verdict = next(v for v in summary["verdicts"] if v["k"] == k and v["concurrency"] == level)
        cells = [
            str(level),
            f"{none['per_device']:.1f} [{none['throughput_min'] / devices:.1f}-"
            f"{none['throughput_max'] / devices:.1f}]",
            _speedup_cell(base),
            _speedup_cell(draft),
            f"{_length(base)} / {_length(draft)}",
            f"**{verdict['choice']}** ({verdict['text']})",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def controlled_text(summary: ComparisonSummary) -> str:
    """What made the comparison controlled, in one paragraph."""
    versions = summary["environment"].get("versions", {})
    orders = "; ".join(f"round {r['round']}: " + " -> ".join(r["order"]) for r in summary["rounds"])
    servers = {
        "keep": "each configuration's server started once and kept alive for all rounds",
        "once": "each configuration's server started once, one at a time, its rounds inside it",
    }.get(
        summary["servers"],
        "every configuration's server restarted in every round (one server at a time)",
    )
    rounds = (
        f"{summary['repeats']} rounds inside each server"
        if summary["servers"] == "once"
        else f"{summary['repeats']} interleaved rounds with the serving order rotated ({orders})"
    )
    starts = [s["start_s"] for s in summary["server_starts"]]
    return (
        f"Controlled: one vLLM build ({versions.get('vllm')}) for all three configurations, "
        "the same serve arguments (only `--speculative-config` differs), the same prompts, "
        f"the same warm-up (then /metrics read), {rounds}; {servers}; "
        f"{len(starts)} server start(s), "
        f"{sum(starts):.0f} s in all. Each cell is the mean of {summary['repeats']} repeat(s) "
        "[slowest-fastest]; one configuration beats another only when its slowest repeat is "
        "faster than the other's fastest, otherwise they tie. Acceptance is the server's own "
        "/metrics counters over the measured requests (warm-up excluded), equal to "
        "`vllm bench serve`'s for every repeat."
    )


def comparison_point(summary: ComparisonSummary, role: str, k: int, level: int) -> Point:
    return next(
        p
        for p in summary["points"]
        if p["role"] == role and p["k"] == k and p["concurrency"] == level
    )


def _speedup_cell(point: Point) -> str:
    return (
        f"{point['per_device']:.1f} ({point['speedup']:.2f}x; "
        f"{point['speedup_min']:.2f}-{point['speedup_max']:.2f}x)"
    )


def _length(point: Point) -> str:
    acceptance = point["acceptance"]
    if acceptance is None or acceptance["mean_length"] is None:
        return "-"
    return f"{acceptance['mean_length']:.2f}"


def _comparison_details(summary: ComparisonSummary) -> list[str]:
    lines = [
        "| configuration | concurrency | output tok/s by round | median TPOT ms "
        "| median TTFT ms | acceptance length | acceptance by position |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in summary["points"]:
        label = p["role"] if p["role"] == NO_SPECULATION else f"{p['role']} k={p['k']}"
        acceptance = p["acceptance"]
        positions = (
            " / ".join(f"{x:.3f}" for x in acceptance["per_position"]) if acceptance else "-"
        )
        cells = [
            label,
            str(p["concurrency"]),
            ", ".join(f"{r:.1f}" for r in p["runs"]),
            _ms(p["median_tpot_ms"]),
            _ms(p["median_ttft_ms"]),
            _length(p),
            positions,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
