"""Tuning reports: results.json, results.md and three PNG plots (matplotlib, headless)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eaglequant.render.reports import mean_positions, tune_markdown


def write_reports(out: Path, summary: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = (
        "## num_speculative_tokens sweep on vllm serve\n\n"
        f"Output tokens/s (speedup over no speculation); ISL {summary['isl']}, OSL {summary['osl']}"
        f"{', prompts ' + summary['prompts'] if summary['prompts'] else ''}, "
        f"max-model-len {summary['max_model_len']}.\n\n"
        + tune_markdown(summary)
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
            positions = mean_positions(rows)
            axes.plot(range(1, len(positions) + 1), positions, marker="o", label=f"k={k}")
    axes.set_xlabel("draft position")
    axes.set_ylabel("acceptance rate")
    axes.set_ylim(0, 1)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out / "acceptance.png", dpi=100)
    plt.close(figure)
