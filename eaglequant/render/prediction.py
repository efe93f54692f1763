"""``tune --predict``'s table: every point predicted, beside what was measured there (for
``results.md`` and the model card, through ``render.reports.tune_markdown``)."""

from __future__ import annotations

from eaglequant.tune.summary import PredictionRecord


def prediction_markdown(prediction: PredictionRecord) -> str:
    """``tune --predict``: every point predicted, beside what was measured there."""
    fitted = ", ".join(f"k={k}" if k else "no speculation" for k in prediction["fitted_on"])
    error = prediction["median_abs_error"]
    lines = [
        f"### Predicted from {fitted} (`tune --predict`)",
        "",
        f"{prediction['server_starts']} server starts against the full sweep's "
        f"{prediction['full_sweep_server_starts']}; median error where a prediction was then "
        f"measured: {'-' if error is None else f'{error:.1%}'}.",
        "",
        "| k | concurrency | predicted tok/s [interval] | measured tok/s | |",
        "|---|---|---|---|---|",
    ]
    for p in prediction["points"]:
        measured = "only predicted" if p["measured"] is None else f"{p['measured']:.1f}"
        note = "fitted" if p["fitted"] else ("extrapolated" if p["extrapolated"] else "")
        lines.append(
            f"| {p['k']} | {p['concurrency']} | {p['point']:.1f} [{p['low']:.1f}-{p['high']:.1f}]"
            f" | {measured} | {note} |"
        )
    return "\n".join(lines) + "\n"
