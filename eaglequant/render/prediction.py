"""``tune --predict``'s tables: every point predicted with its interval, beside what was
measured there (for ``results.md`` and the model card, through ``render.reports``)."""

from __future__ import annotations

from collections.abc import Sequence

from eaglequant.results.tune_summary import (
    ComparisonPrediction,
    PredictedPoint,
    PredictedSchedule,
    PredictionRecord,
)


def _name(k: int) -> str:
    return f"k={k}" if k else "no speculation"


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def points_table(points: Sequence[PredictedPoint]) -> list[str]:
    """k | concurrency | predicted [interval] | measured [interval] | error | note."""
    lines = [
        "| k | concurrency | predicted tok/s [interval] | measured tok/s [rounds] | error | |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        measured = (
            "only predicted"
            if p["measured"] is None
            else f"{p['measured']:.1f} [{p['measured_low']:.1f}-{p['measured_high']:.1f}]"
        )
        notes = ["fitted"] * p["fitted"] + ["extrapolated"] * p["extrapolated"]
        notes += [f"too noisy ({p['spread']:.0%} wide)"] * p["noisy"]
        found = p["measured"]
        outside = found is not None and not p["fitted"] and _outside(found, p["low"], p["high"])
        notes += ["measured outside the interval"] * outside
        error = "" if p["fitted"] else _error(p["error"])
        lines.append(
            f"| {p['k']} | {p['concurrency']} | {p['point']:.1f} [{p['low']:.1f}-{p['high']:.1f}]"
            f" | {measured} | {error} | {', '.join(notes)} |"
        )
    return lines


def prediction_markdown(prediction: PredictionRecord) -> str:
    """``tune --predict``: every point predicted, beside what was measured there."""
    fitted = ", ".join(_name(k) for k in prediction["fitted_on"])
    winners = ", ".join(f"{_name(k)} at {c}" for c, k in prediction["winners"].items())
    confirmed = prediction["confirmed"] or "nothing more (already measured)"
    lines = [
        f"### Predicted from {fitted} (`tune --predict`)",
        "",
        f"{prediction['server_starts']} server starts against the full sweep's "
        f"{prediction['full_sweep_server_starts']}. Predicted winners by concurrency: {winners}"
        f"; confirmation served: {confirmed}. Median error where a prediction was then "
        f"measured: {_error(prediction['median_abs_error'])}.",
    ]
    scheduled = prediction.get("schedule_predicted")
    if scheduled:
        lines += ["", schedule_sentence(scheduled)]
    if prediction["noisy_measured"]:
        ks = ", ".join(_name(k) for k in prediction["noisy_measured"])
        lines += ["", f"Too noisy to predict, so measured instead: {ks}."]
    checks = [
        f"k={c['k']} at {c['concurrency']}: {c['predicted_length']:.2f} predicted, "
        f"{c['measured_length']:.2f} measured"
        for c in prediction.get("acceptance_checks", [])
        if c["measured_length"] is not None
    ]
    if checks:
        lines += ["", "Tokens per verify step from the largest k's counters: " + "; ".join(checks)]
    return "\n".join([*lines, "", *points_table(prediction["points"])]) + "\n"


def schedule_sentence(scheduled: PredictedSchedule) -> str:
    """The winners' schedule as predicted, and whether it was served."""
    runs = "; ".join(
        f"{point:.1f} [{low:.1f}-{high:.1f}] at {c}"
        for c, (low, point, high) in scheduled["runs"].items()
    )
    text = f"The winners' schedule {scheduled['ranges']} predicted: {runs} tok/s"
    if not scheduled["behind"]:
        return text + "; it holds, so it was served" + _schedule_measured(scheduled) + "."
    behind = ", ".join(f"{_name(k)} at {c}" for c, k in scheduled["behind"].items())
    return (
        f"{text}; {behind} beats it (where the schedule's k is 0, vLLM's drafter still runs "
        "its pass every step), so the best single choice was served instead."
    )


def _schedule_measured(scheduled: PredictedSchedule) -> str:
    """``: measured ... at c (error e); ...`` where the schedule was served, else nothing."""
    measured, errors = scheduled.get("measured", {}), scheduled.get("errors", {})
    found = []
    for c, (low, mean, high) in measured.items():
        predicted = scheduled["runs"].get(c)
        outside = predicted is not None and _outside(mean, predicted[0], predicted[2])
        note = ", outside the predicted interval" * outside
        found.append(f"{mean:.1f} [{low:.1f}-{high:.1f}] at {c} ({_error(errors.get(c))}{note})")
    return ": measured " + "; ".join(found) if found else ""


def _outside(measured: float, low: float, high: float) -> bool:
    """Whether a measured mean lies outside the predicted interval [low, high]."""
    return not low <= measured <= high


def comparison_prediction_markdown(prediction: ComparisonPrediction) -> str:
    """``tune --predict --baseline``: both drafts' points predicted, beside the measured."""
    measured = ", ".join(_name(k) for k in prediction["measured_ks"])
    lines = [
        f"### The release table predicted at every k {prediction['ks']} (`tune --predict`)",
        "",
        f"Fitted on no speculation and each draft at k={max(prediction['ks'])}; measured at "
        f"{measured}. The draft's predicted best single k: "
        f"{_name(prediction['recommended_k'])}. {prediction['server_starts']} server starts "
        f"against the full table's {prediction['full_table_server_starts']}. Median error "
        f"where a prediction was then measured: {_error(prediction['median_abs_error'])}.",
    ]
    if prediction["noisy_measured"]:
        ks = ", ".join(_name(k) for k in prediction["noisy_measured"])
        lines += ["", f"Too noisy to predict, so measured instead: {ks}."]
    for role in prediction["roles"]:
        lines += ["", f"**{role['role']}**", "", *points_table(role["points"])]
    return "\n".join(lines) + "\n"
