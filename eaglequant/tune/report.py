"""Tuning reports: results.json, results.md and three PNG plots (matplotlib, headless).

matplotlib is the ``plots`` extra: without it the tables are written and one line says which
extra draws the plots.

A sweep plots each k; a baseline comparison plots the baseline and the draft
(speedup over no speculation against concurrency, tok/s per device, acceptance
by position).

The plots are read at a glance: concurrency on a log axis labelled with the
measured levels themselves (1, 8, 64), the min-max spread of the repeats as
error bars, the 1.0x break-even line on the speedup plot, integer draft
positions, the recommended configuration drawn bold and starred, and a title
naming target, draft, ISL/OSL and the repeats.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from eaglequant.io.output import write_text_atomic
from eaglequant.render.prediction import comparison_prediction_markdown
from eaglequant.render.reports import (
    comparison_markdown,
    comparison_point,
    config_name,
    mean_positions,
    point,
    tune_markdown,
)
from eaglequant.results.tune_summary import (
    BASELINE,
    DRAFT,
    NO_SPECULATION,
    ComparisonSummary,
    SweepSummary,
)


def write_comparison(out: Path, summary: ComparisonSummary) -> None:
    """results.json, results.md (the release table) and the plots of a baseline comparison."""
    write_text_atomic(out / "results.json", json.dumps(summary, indent=2) + "\n")
    heading = (
        "## Draft vs baseline vs no speculation on vllm serve\n\n"
        f"Target `{summary['target']}`, draft `{summary['draft']}`, baseline "
        f"`{summary['baseline']}`; ISL {summary['isl']}, OSL {summary['osl']}"
        f"{', prompts ' + summary['prompts'] if summary['prompts'] else ''}, "
        f"max-model-len {summary['max_model_len']}, {summary['devices']} "
        f"{summary['device_unit']}(s).\n\n"
    )
    text = heading + comparison_markdown(summary)
    if "prediction" in summary:
        text += "\n\n" + comparison_prediction_markdown(summary["prediction"])
    write_text_atomic(out / "results.md", text)
    plot_comparison(out, summary)


def write_reports(out: Path, summary: SweepSummary) -> None:
    write_text_atomic(out / "results.json", json.dumps(summary, indent=2) + "\n")
    text = (
        "## num_speculative_tokens sweep on vllm serve\n\n"
        f"ISL {summary['isl']}, OSL {summary['osl']}"
        f"{', prompts ' + summary['prompts'] if summary['prompts'] else ''}, "
        f"max-model-len {summary['max_model_len']}.\n\n"
        + tune_markdown(summary)
        + f"\nRecommended serve line: `{summary['serve_command']}`\n"
    )
    if summary["schedule"]["serve_command"] and not summary["recommendation"]["schedule"]:
        text += f"\nThe schedule's serve line: `{summary['schedule']['serve_command']}`\n"
    write_text_atomic(out / "results.md", text)
    plot(out, summary)


def title(summary: SweepSummary) -> str:
    target, draft = (Path(*Path(summary[key]).parts[-2:]) for key in ("target", "draft"))
    return (
        f"target {target}, draft {draft}\n"
        f"ISL {summary['isl']} / OSL {summary['osl']}, {summary['repeats']} repeat(s) per point"
    )


def series(summary: SweepSummary) -> list[tuple[str, int | None, bool]]:
    """(label, k or None for the schedule, recommended) for every measured configuration."""
    choice = summary["recommendation"]
    found: list[tuple[str, int | None, bool]] = [
        (config_name(k), k, not choice["schedule"] and choice["k"] == k)
        for k in [0, *summary["ks"]]
    ]
    if summary["schedule"]["results"]:
        found.append(("schedule", None, bool(choice["schedule"])))
    return found


PLOTS_SKIPPED = "tune: no plots: matplotlib is not installed (pip install 'eaglequant[plots]')"


def _headless_matplotlib() -> bool:
    """matplotlib set to draw files (Agg), or False (one line on stderr) where it is absent."""
    if importlib.util.find_spec("matplotlib") is None:
        print(PLOTS_SKIPPED, file=sys.stderr)
        return False
    # lazy: the plots extra
    import matplotlib

    matplotlib.use("Agg")
    return True


def plot(out: Path, summary: SweepSummary) -> None:
    if not _headless_matplotlib():
        return
    _concurrency_plot(out / "throughput.png", summary, speedup=False)
    _concurrency_plot(out / "speedup.png", summary, speedup=True)
    _acceptance_plot(out / "acceptance.png", summary)


def _bars(
    summary: SweepSummary, k: int | None, speedup: bool
) -> tuple[list[int], list[float], list[Any]]:
    """Concurrencies measured, means and min-max error bars of one configuration (speedup:
    over no speculation; ``tune --predict`` serves some ks at some concurrencies only)."""
    levels, values, low, high = [], [], [], []
    for c in summary["concurrencies"]:
        row, baseline = point(summary, k, c), point(summary, 0, c)
        if row is None or baseline is None:
            continue
        scale = 1 / baseline["output_throughput"] if speedup else 1.0
        levels.append(c)
        values.append(row["output_throughput"] * scale)
        low.append((row["output_throughput"] - row["throughput_min"]) * scale)
        high.append((row["throughput_max"] - row["output_throughput"]) * scale)
    return levels, values, [low, high]


def _concurrency_plot(path: Path, summary: SweepSummary, speedup: bool) -> None:
    # lazy: the plots extra
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    concurrencies = summary["concurrencies"]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, k, recommended in series(summary):
        if speedup and k == 0:
            continue
        levels, values, bars = _bars(summary, k, speedup)
        if not levels:
            continue  # a k tune --predict only predicted
        axes.errorbar(
            levels,
            values,
            yerr=bars,
            marker="*" if recommended else "o",
            markersize=12 if recommended else 5,
            linewidth=3 if recommended else 1.2,
            capsize=3,
            label=f"{label} (recommended)" if recommended else label,
        )
    if speedup:
        none = summary["recommendation"]["choice"] == "none"
        label = "no speculation = 1.0x (break-even)" + (" (recommended)" if none else "")
        axes.axhline(1.0, color="black", linestyle="--", linewidth=3 if none else 1, label=label)
    axes.set_xscale("log")
    axes.set_xticks(concurrencies, [str(c) for c in concurrencies])
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_xlabel("concurrency (requests in flight)")
    axes.set_ylabel("speedup vs no speculation" if speedup else "output tokens/s")
    _finish(figure, axes, title(summary), path)


def _acceptance_plot(path: Path, summary: SweepSummary) -> None:
    # lazy: the plots extra
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for k in summary["ks"]:
        rows = [r["per_position"] for r in summary["results"] if r["k"] == k and r["per_position"]]
        if rows:
            positions = mean_positions(rows)
            axes.plot(range(1, len(positions) + 1), positions, marker="o", label=f"k={k}")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("draft position")
    axes.set_ylabel("acceptance rate (mean over concurrencies)")
    axes.set_ylim(0, 1)
    _finish(figure, axes, title(summary), path)


def _finish(figure: Any, axes: Any, heading: str, path: Path) -> None:
    # lazy: the plots extra
    import matplotlib.pyplot as plt

    axes.set_title(heading, fontsize=9)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_comparison(out: Path, summary: ComparisonSummary) -> None:
    if not _headless_matplotlib():
        return
    _comparison_plot(out / "speedup.png", summary, speedup=True)
    _comparison_plot(out / "throughput.png", summary, speedup=False)
    _comparison_acceptance(out / "acceptance.png", summary)


def _comparison_plot(path: Path, summary: ComparisonSummary, speedup: bool) -> None:
    """One line per configuration against concurrency, min-max bars; 1.0x where speedup."""
    # lazy: the plots extra
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    levels = summary["concurrencies"]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    configs = [(NO_SPECULATION, 0)] * (not speedup)
    configs += [(role, k) for k in summary["ks"] for role in (BASELINE, DRAFT)]
    devices = summary["devices"]
    for role, k in configs:
        points = [comparison_point(summary, role, k, level) for level in levels]
        if speedup:
            values = [p["speedup"] for p in points]
            low = [p["speedup"] - p["speedup_min"] for p in points]
            high = [p["speedup_max"] - p["speedup"] for p in points]
        else:
            values = [p["per_device"] for p in points]
            low = [(p["output_throughput"] - p["throughput_min"]) / devices for p in points]
            high = [(p["throughput_max"] - p["output_throughput"]) / devices for p in points]
        label = role if role == NO_SPECULATION else f"{role} k={k}"
        axes.errorbar(levels, values, yerr=[low, high], marker="o", capsize=3, label=label)
    if speedup:
        axes.axhline(
            1.0, color="black", linestyle="--", linewidth=1, label=f"{NO_SPECULATION} = 1.0x"
        )
    axes.set_xscale("log")
    axes.set_xticks(levels, [str(c) for c in levels])
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_xlabel("concurrency (requests in flight)")
    unit = summary["device_unit"]
    axes.set_ylabel(f"speedup vs {NO_SPECULATION}" if speedup else f"output tokens/s per {unit}")
    _finish(figure, axes, _comparison_title(summary), path)


def _comparison_acceptance(path: Path, summary: ComparisonSummary) -> None:
    # lazy: the plots extra
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for k in summary["ks"]:
        for role in (BASELINE, DRAFT):
            rows = [
                p["acceptance"]["per_position"]
                for p in summary["points"]
                if p["role"] == role and p["k"] == k and p["acceptance"]
            ]
            if rows:
                positions = mean_positions(rows)
                axes.plot(
                    range(1, len(positions) + 1), positions, marker="o", label=f"{role} k={k}"
                )
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("draft position")
    axes.set_ylabel("acceptance rate (mean over concurrencies)")
    axes.set_ylim(0, 1)
    _finish(figure, axes, _comparison_title(summary), path)


def _comparison_title(summary: ComparisonSummary) -> str:
    target, draft, baseline = (
        Path(*Path(summary[key]).parts[-2:]) for key in ("target", "draft", "baseline")
    )
    return (
        f"target {target}: draft {draft} vs baseline {baseline}\n"
        f"ISL {summary['isl']} / OSL {summary['osl']}, {summary['repeats']} interleaved "
        "round(s)"
    )
