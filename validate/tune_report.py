"""Tuning reports: results.json, results.md and three PNG plots (matplotlib, headless)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PLOTS = ("throughput.png", "speedup.png", "acceptance.png")


def markdown_tables(summary: dict[str, Any]) -> str:
    """Throughput (speedup) per concurrency and k, and acceptance per k, as Markdown."""
    results = summary["results"]
    ks = [0, *summary["ks"]]
    header = ["concurrency"] + ["no spec" if k == 0 else f"k={k}" for k in ks] + ["best k"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for concurrency in summary["concurrencies"]:
        cells = [str(concurrency)]
        for k in ks:
            row = next(
                (r for r in results if r["k"] == k and r["concurrency"] == concurrency), None
            )
            if row is None:
                cells.append("-")
            elif k == 0 or row["speedup"] is None:
                cells.append(f"{row['output_throughput']:.1f}")
            else:
                cells.append(f"{row['output_throughput']:.1f} ({row['speedup']:.2f}x)")
        cells.append(str(summary["recommended_k"].get(str(concurrency), "-")))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| k | mean acceptance length | acceptance by position |", "|---|---|---|"]
    for k in summary["ks"]:
        rows = [r for r in results if r["k"] == k and r["acceptance_length"] is not None]
        if not rows:
            continue
        mean = sum(r["acceptance_length"] for r in rows) / len(rows)
        per_pos = _mean_positions(rows)
        lines.append(f"| {k} | {mean:.3f} | {' / '.join(f'{p:.3f}' for p in per_pos)} |")
    return "\n".join(lines) + "\n"


def _mean_positions(rows: list[dict[str, Any]]) -> list[float]:
    width = max(len(r["per_position"]) for r in rows)
    sums = [0.0] * width
    for r in rows:
        for i, value in enumerate(r["per_position"]):
            sums[i] += value
    return [s / len(rows) for s in sums]


def write_reports(out: Path, summary: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = (
        "## num_speculative_tokens sweep on vllm serve\n\n"
        f"Output tokens/s (speedup over no speculation); ISL {summary['isl']}, OSL {summary['osl']}"
        f"{', prompts ' + summary['prompts'] if summary['prompts'] else ''}, "
        f"max-model-len {summary['max_model_len']}.\n\n"
        + markdown_tables(summary)
        + f"\nRecommended: `{summary['serve_command']}`\n"
    )
    (out / "results.md").write_text(text)
    plot(out, summary)


def plot(out: Path, summary: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = summary["results"]
    concurrencies = summary["concurrencies"]

    def series(k: int, key: str) -> list[float]:
        return [
            next((r[key] for r in results if r["k"] == k and r["concurrency"] == c), float("nan"))
            or float("nan")
            for c in concurrencies
        ]

    for name, key, ks, ylabel in (
        ("throughput.png", "output_throughput", [0, *summary["ks"]], "output tokens/s"),
        ("speedup.png", "speedup", summary["ks"], "speedup vs no speculation"),
    ):
        figure, axes = plt.subplots(figsize=(6, 4))
        for k in ks:
            axes.plot(
                concurrencies, series(k, key), marker="o", label="no spec" if k == 0 else f"k={k}"
            )
        axes.set_xscale("log", base=2)
        axes.set_xlabel("concurrency")
        axes.set_ylabel(ylabel)
        axes.legend()
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(out / name, dpi=100)
        plt.close(figure)
    figure, axes = plt.subplots(figsize=(6, 4))
    for k in summary["ks"]:
        rows = [r for r in results if r["k"] == k and r["per_position"]]
        if rows:
            positions = _mean_positions(rows)
            axes.plot(range(1, len(positions) + 1), positions, marker="o", label=f"k={k}")
    axes.set_xlabel("draft position")
    axes.set_ylabel("acceptance rate")
    axes.set_ylim(0, 1)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out / "acceptance.png", dpi=100)
    plt.close(figure)
