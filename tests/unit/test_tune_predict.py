"""tune's prediction model on hand-computed cases and recorded sweeps (bench/results-tune)."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean, median

import pytest

from eaglequant.tune.predict import (
    Point,
    confirmation_plan,
    expected_length,
    fit,
    fit_target_step,
    predict,
)

REPO = Path(__file__).resolve().parents[2]
DEEP = REPO / "bench" / "results-tune" / "deep-target" / "results.json"


def _recorded(path: Path) -> list[Point]:
    rows = json.loads(path.read_text())["results"]
    return [
        Point(r["k"], r["concurrency"], tuple(r["runs"]), tuple(r["per_position"])) for r in rows
    ]


def test_expected_length_sums_acceptance_by_position() -> None:
    rates = [0.8, 0.5, 0.25]  # a_j: verify steps that accepted draft token j (cumulative)
    assert [expected_length(rates, k) for k in range(4)] == pytest.approx([1, 1.8, 2.3, 2.55])
    with pytest.raises(ValueError, match="positions 1..3"):
        expected_length(rates, 4)


def test_a_smaller_k_from_the_largest_matches_vllms_counters() -> None:
    """The deeper toy target's recorded sweep: k=3's counters give k=2's acceptance length
    as vLLM measured it in k=2's own server (2.488) within 0.01."""
    points = _recorded(DEEP)
    three = next(p for p in points if p.k == 3)
    rows = json.loads(DEEP.read_text())["results"]
    two = next(r["acceptance_length"] for r in rows if r["k"] == 2)
    assert expected_length(three.per_position, 2) == pytest.approx(two, abs=0.01)


def test_the_target_step_fit_recovers_a_line() -> None:
    """T(n) = 0.02 + 0.003 n seconds: throughput c / T(c) at three concurrencies."""
    pairs = [(c, c / (0.02 + 0.003 * c)) for c in (1, 4, 8)]
    assert fit_target_step(pairs) == pytest.approx((0.02, 0.003))
    with pytest.raises(ValueError, match="2\\+ concurrencies"):
        fit_target_step(pairs[:1])


def test_the_fit_reproduces_its_own_speculative_points() -> None:
    points = [p for p in _recorded(DEEP) if p.k in (0, 3)]
    model = fit(points)
    for p in points:
        if p.k == 3:
            assert model.throughput(3, p.concurrency) == pytest.approx(fmean(p.runs))


def test_recorded_deep_sweep_k2_predicted_within_ten_percent() -> None:
    """Fitted on no speculation and k=3 only, k=2 at concurrency 1, 4 and 8 against its own
    measured servers: median error at most 10% (measured: 1.1%, 7.6%, 7.0%), and each
    interval from the repeats' spread brackets the point."""
    points = _recorded(DEEP)
    predicted = {
        (p.k, p.concurrency): p for p in predict([p for p in points if p.k in (0, 3)], [2])
    }
    errors = []
    for p in points:
        if p.k == 2:
            guess = predicted[2, p.concurrency]
            assert guess.low <= guess.point <= guess.high
            errors.append(abs(guess.point / fmean(p.runs) - 1))
    assert len(errors) == 3 and median(errors) <= 0.10, errors


def test_only_one_speculative_k_is_fitted() -> None:
    with pytest.raises(ValueError, match="one speculative k"):
        fit(_recorded(DEEP))


def test_the_confirmation_plan_is_the_predicted_best_and_its_neighbours() -> None:
    def row(c: int, values: dict[int, float]) -> list:
        from eaglequant.tune.predict import Prediction

        return [Prediction(k, c, v, v, v, False) for k, v in values.items()]

    predictions = row(1, {0: 10, 2: 30, 4: 35, 6: 20}) + row(16, {0: 50, 2: 40, 4: 30, 6: 20})
    measured = {(0, 1), (6, 1), (0, 16), (6, 16)}
    # c=1: best 4, neighbours 2 and 6 (6 measured); c=16: no speculation best, and k=2
    assert confirmation_plan(predictions, measured) == {(2, 1), (4, 1), (2, 16)}


def test_tune_predict_serves_the_fit_then_only_the_plan(tmp_path: Path) -> None:
    """The sweep's orchestration on the recorded deeper-toy sweep standing in for servers:
    no speculation and k=3 at every concurrency, then only the planned (k, concurrency)
    points; results.json and results.md carry predicted beside measured."""
    from eaglequant.render.reports import tune_markdown
    from eaglequant.tune.request import TuneRequest
    from eaglequant.tune.sweep import Configuration, TuneResult, predicted_sweep, prediction_block

    rows = json.loads(DEEP.read_text())["results"]
    served: list[tuple[int, tuple[int, ...]]] = []

    def run(config: Configuration, concurrencies: list[int] | None = None) -> list[TuneResult]:
        at = tuple(concurrencies or (1, 4, 8))
        served.append((config.k, at))
        return [
            TuneResult(r["k"], r["concurrency"], r["runs"], None, None, r["per_position"])
            for r in rows
            if r["k"] == config.k and r["concurrency"] in at
        ]

    request = TuneRequest(
        target=tmp_path, draft=tmp_path, ks=(2, 3), concurrencies=(1, 4, 8), predict=True
    )
    configs = [Configuration(label=f"k{k}", k=k, spec=None) for k in (0, 2, 3)]
    results, prediction = predicted_sweep(request, configs, run)
    planned = confirmation_plan(prediction, {(k, c) for k in (0, 3) for c in (1, 4, 8)})
    assert served[:2] == [(0, (1, 4, 8)), (3, (1, 4, 8))]
    assert served[2:] == [(2, tuple(sorted(c for _, c in planned)))] and planned
    block = prediction_block(prediction, results, request)
    assert block["server_starts"] == 3 and block["full_sweep_server_starts"] == 3
    assert block["median_abs_error"] is not None and block["median_abs_error"] <= 0.10
    k2 = [p for p in block["points"] if p["k"] == 2]
    assert {p["concurrency"] for p in k2 if p["measured"] is not None} == {c for _, c in planned}
    # results.md and the model card both render the table (render.reports.tune_markdown)
    recorded = json.loads(DEEP.read_text())  # written before results.json had a schema version
    summary = recorded | {"schema_version": 2, "kind": "sweep", "prediction": block}
    text = tune_markdown(summary)
    assert "(`tune --predict`)" in text and "3 server starts against the full sweep's 3" in text
    assert "| 3 | 1 |" in text and "fitted" in text
