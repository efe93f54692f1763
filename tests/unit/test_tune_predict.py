"""tune's prediction model on hand-computed cases, recorded counters and a recorded sweep."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean, median

import numpy as np
import pytest

from eaglequant.render.prediction import schedule_sentence
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.tune.predict import (
    MEANINGLESS_SPREAD,
    Point,
    Prediction,
    TargetStep,
    acceptance_by_position,
    expected_length,
    fit,
    plan,
    predict,
    predict_schedule,
    predicted_length,
)
from tests.unit import recorded_counts

REPO = Path(__file__).resolve().parents[2]
DEEP = REPO / "bench" / "results-tune" / "deep-target" / "results.json"


def _recorded(path: Path) -> list[Point]:
    rows = json.loads(path.read_text())["results"]
    return [
        Point(r["k"], r["concurrency"], tuple(r["runs"]), tuple(r["per_position"])) for r in rows
    ]


def test_expected_length_sums_acceptance_by_position() -> None:
    rates = [0.8, 0.5, 0.25]  # a_j: verify steps that accepted draft tokens 1..j
    assert [expected_length(rates, k) for k in range(4)] == pytest.approx([1, 1.8, 2.3, 2.55])
    with pytest.raises(ValueError, match="positions 1..3"):
        expected_length(rates, 4)


def _walk(right: np.ndarray, k: int) -> tuple[float, list[float]]:
    """Speculative steps of k over a draft that is right where ``right`` is: tokens per verify
    step and acceptance by position (a step accepts the run of right positions from its start,
    up to k; the target's token after them is the next step's start minus one)."""
    t, steps, tokens, at = 0, 0, 0, [0] * k
    while t + k + 1 < len(right):
        accepted = 0
        while accepted < k and right[t + accepted]:
            accepted += 1
        for position in range(accepted):
            at[position] += 1
        steps, tokens, t = steps + 1, tokens + accepted + 1, t + accepted + 1
    return tokens / steps, [a / steps for a in at]


def test_a_smaller_ks_length_from_a_larger_ks_counters_follows_where_its_steps_start() -> None:
    """A draft right after a right position with probability 0.85, after a wrong one 0.45: k=8's
    counters over-weight the positions after a rejection; the plain sum misses each smaller k
    by more than 5%, the model by under 2% (the chain it assumes)."""
    rng = np.random.default_rng(0)
    draws, right = rng.random(400_000), np.zeros(400_000, dtype=bool)
    for t in range(1, len(right)):
        right[t] = draws[t] < (0.85 if right[t - 1] else 0.45)
    _, rates = _walk(right, 8)
    assert predicted_length(rates, 8) == expected_length(rates, 8)
    for k in (1, 2, 3, 4):
        length, _ = _walk(right, k)
        assert abs(expected_length(rates, k) / length - 1) > 0.05
        assert predicted_length(rates, k) == pytest.approx(length, rel=0.02)
    # nothing to fit: one position, or a curve that never falls, gives the plain sum
    assert predicted_length([0.6], 1) == expected_length([0.6], 1)
    assert predicted_length([0.5, 0.5, 0.5], 2) == expected_length([0.5, 0.5, 0.5], 2)


@pytest.mark.parametrize("name", ["BF16", "FP8", "COARSE", "RANDOM"])
def test_acceptance_at_a_smaller_k_from_recorded_counters(name: str) -> None:
    """Real vLLM runs at k=3: the counters give vLLM's own mean acceptance length at k=3, and
    at k=1 and k=2 what the same verify steps accept when cut to k (each request's histogram:
    a step that accepted j tokens accepts min(j, k))."""
    metrics = getattr(recorded_counts, f"{name}_METRICS")
    counts = SpecDecodeCounts.from_vllm(metrics)
    rates = acceptance_by_position(counts)
    assert expected_length(rates, 3) == pytest.approx(counts.mean_acceptance_length)
    requests = getattr(recorded_counts, name)
    steps = sum(sum(histogram) for histogram, _ in requests)
    pooled = SpecDecodeCounts.total(SpecDecodeCounts.from_histogram(h, t) for h, t in requests)
    for k in (1, 2):
        accepted = sum(
            min(j, k) * count for histogram, _ in requests for j, count in enumerate(histogram)
        )
        cut = expected_length(acceptance_by_position(pooled), k)
        assert cut == pytest.approx(1 + accepted / steps)
    with pytest.raises(ValueError, match="no drafts"):
        acceptance_by_position(SpecDecodeCounts())


def test_the_target_step_is_linear_between_measured_token_counts() -> None:
    """Steps of 20, 26 and 50 ms at 1, 4 and 16 tokens: reproduced, interpolated, and past
    16 tokens continued with the last segment's slope (2 ms a token)."""
    step = TargetStep.measured([(c, c / t) for c, t in ((1, 0.020), (4, 0.026), (16, 0.050))])
    assert [step(n) for n in (1, 4, 16)] == pytest.approx([0.020, 0.026, 0.050])
    assert step(10) == pytest.approx(0.038) and step(36) == pytest.approx(0.090)
    assert step.covered == 16
    with pytest.raises(ValueError, match="2\\+ concurrencies"):
        TargetStep.measured([(1, 50.0)])


def test_the_fit_reproduces_both_measured_servers() -> None:
    points = [p for p in _recorded(DEEP) if p.k in (0, 3)]
    model = fit(points)
    for p in points:
        assert model.throughput(p.k, p.concurrency) == pytest.approx(fmean(p.runs))


def test_recorded_deep_sweep_k2_predicted_within_ten_percent() -> None:
    """Fitted on no speculation and k=3 only, k=2 at concurrency 1, 4 and 8 against its own
    measured servers: median error at most 10%, each interval bracketing its point."""
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


def _row(c: int, values: dict[int, tuple[float, float, float]]) -> list[Prediction]:
    return [Prediction(k, c, v, low, high, False) for k, (low, v, high) in values.items()]


def test_the_plan_decides_on_intervals_else_the_smaller_k() -> None:
    """c=1: k=4 predicted fastest, but its interval overlaps k=2's: k=2. c=16: k=2 beats
    no speculation and k=4 beyond the intervals. One k everywhere: no schedule."""
    predictions = _row(1, {0: (9, 10, 11), 2: (28, 30, 32), 4: (31, 33, 35)})
    predictions += _row(16, {0: (49, 50, 51), 2: (58, 60, 62), 4: (40, 41, 42)})
    chosen = plan(predictions, (2, 4))
    assert chosen.winners == {1: 2, 16: 2} and chosen.single == 2
    assert chosen.schedule is None and chosen.noisy == []


def test_the_plan_schedules_different_winners_and_flags_noisy_points() -> None:
    """c=1: k=4 predicted fastest, but k=2's interval is so wide it ties: k=2, the smaller,
    wins there, on a prediction wider than MEANINGLESS_SPREAD, so it is to be measured.
    c=16: no speculation. The schedule [[1,1,2],[2,16,0]] unless schedules are off."""
    wide = 40 * MEANINGLESS_SPREAD
    predictions = _row(1, {0: (9, 10, 11), 2: (40 - wide, 40, 40 + wide), 4: (45, 46, 47)})
    predictions += _row(16, {0: (59, 60, 61), 2: (40, 41, 42), 4: (30, 31, 32)})
    chosen = plan(predictions, (2, 4))
    assert chosen.winners == {1: 2, 16: 0}
    assert chosen.schedule == [(1, 1, 2), (2, 16, 0)]
    assert chosen.noisy == [(2, 1)]
    assert plan(predictions, (2, 4), schedules=False).schedule is None


def test_a_noisy_point_that_cannot_change_the_choice_is_not_measured() -> None:
    """c=16: no speculation wins; k=2 and k=4 tie with it on wide predictions. k=2's top
    (63) is above no speculation's (61): served, it could beat it. k=4's whole interval
    (34-58) lies below 61: whatever it measured, no speculation stays the choice."""
    predictions = _row(1, {0: (9, 10, 11), 2: (38, 40, 42), 4: (45, 46, 47)})
    predictions += _row(16, {0: (58, 60, 61), 2: (45, 54, 63), 4: (34, 46, 58)})
    chosen = plan(predictions, (2, 4))
    assert chosen.winners == {1: 4, 16: 0}
    assert chosen.noisy == [(2, 16)]


def test_a_schedule_predicted_to_fall_behind_is_not_served() -> None:
    """Winners k=2 at 1 and no speculation at 16 make the schedule [[1,1,2],[2,16,0]]. Where
    its k=0 range is predicted at 45-51 tok/s, no speculation (58-61) beats it at 16: the
    best single choice (k=2: 3x at 1, 0.68x at 16) is served instead. Predicted at 57-62,
    it ties there and holds."""
    predictions = _row(1, {0: (9, 10, 11), 2: (28, 30, 32)})
    predictions += _row(16, {0: (58, 60, 61), 2: (40, 41, 42)})

    def behind(schedule: list) -> dict:
        assert schedule == [(1, 1, 2), (2, 16, 0)]
        return {1: (28, 30, 32), 16: (45, 48, 51)}

    chosen = plan(predictions, (2,), scheduled=behind)
    assert chosen.winners == {1: 2, 16: 0} and chosen.schedule is None
    assert chosen.behind == {16: 0} and chosen.single == 2
    assert chosen.scheduled == {1: (28, 30, 32), 16: (45, 48, 51)}
    holds = plan(predictions, (2,), scheduled=lambda _s: {1: (28, 30, 32), 16: (57, 59, 62)})
    assert holds.schedule == [(1, 1, 2), (2, 16, 0)] and holds.behind == {}
    text = schedule_sentence(
        {"ranges": [[1, 1, 2], [2, 16, 0]], "runs": {"16": [45, 48, 51]}, "behind": {"16": 0}}
    )
    assert "48.0 [45.0-51.0] at 16" in text and "no speculation at 16 beats it" in text


def test_a_served_schedule_is_measured_against_its_prediction(tmp_path: Path) -> None:
    """The schedule [[1,1,2],[2,16,0]] predicted at 30 tok/s at 1 and 59 at 16, then served
    and measured at 32-36 and 58-60: its errors (30/34 - 1, 59/59 - 1) are reported and
    counted in the median error, which the single ks' points alone would leave empty."""
    from eaglequant.render.prediction import prediction_markdown
    from eaglequant.tune.request import TuneRequest
    from eaglequant.tune.sweep import Forecast, TuneResult, prediction_block

    predictions = _row(1, {0: (9, 10, 11), 2: (28, 30, 32)})
    predictions += _row(16, {0: (58, 60, 61), 2: (40, 41, 42)})
    chosen = plan(predictions, (2,), scheduled=lambda _s: {1: (28, 30, 32), 16: (57, 59, 62)})
    assert chosen.schedule == [(1, 1, 2), (2, 16, 0)]
    served = [
        TuneResult(0, 1, [10.0, 10.0], None, None),
        TuneResult(0, 16, [60.0, 60.0], None, None),
        TuneResult(2, 1, [20.0, 22.0], None, 1.5),
        TuneResult(2, 16, [40.0, 42.0], None, 1.5),
        TuneResult(2, 1, [32.0, 36.0], None, 1.5, schedule=True),
        TuneResult(2, 16, [58.0, 60.0], None, 1.5, schedule=True),
    ]
    request = TuneRequest(target=tmp_path, draft=tmp_path, ks=(2,), concurrencies=(1, 16))
    block = prediction_block(Forecast(predictions, chosen, "schedule", []), served, request)
    record = block["schedule_predicted"]
    assert record is not None
    assert record["measured"] == {"1": [32.0, 34.0, 36.0], "16": [58.0, 59.0, 60.0]}
    assert record["errors"] == pytest.approx({"1": 30 / 34 - 1, "16": 0.0})
    assert block["median_abs_error"] == pytest.approx(1 - 30 / 34)
    text = prediction_markdown(block)
    assert "measured 34.0 [32.0-36.0] at 1 (-11.8%, outside the predicted interval)" in text
    assert "59.0 [58.0-60.0] at 16 (0.0%)" in text
    assert "Median error where a prediction was then measured: 11.8%" in text


def test_a_point_measured_outside_its_predicted_interval_is_marked() -> None:
    """k=1 predicted 40 [38-42] and measured at 45: marked; k=2 measured inside its interval
    and k=3 (fitted, measured by definition) are not."""
    from eaglequant.render.prediction import points_table
    from eaglequant.tune.predict import predicted_point

    rows = [
        predicted_point(Prediction(1, 4, 40.0, 38.0, 42.0, False), [44.0, 46.0], False),
        predicted_point(Prediction(2, 4, 50.0, 48.0, 52.0, False), [49.0, 53.0], False),
        predicted_point(Prediction(3, 4, 55.0, 55.0, 55.0, False), [54.0, 56.0], True),
    ]
    lines = points_table(rows)[2:]
    assert lines[0].endswith("| measured outside the interval |"), lines[0]
    assert "outside" not in lines[1] and "outside" not in lines[2]


def test_a_schedules_k0_range_pays_one_draft_step() -> None:
    """Target steps 20 ms at 1 token and 26 ms at 4 (2 ms a token past them); k=2 accepting
    0.5 / 0.25 (1.75 tokens a step) with draft steps of 4 ms at 1 and 5 ms at 4. The schedule
    [[1,1,2],[2,4,0]]: k=2's own throughput at 1; at 4 the target's step plus one draft step,
    4 / (26 + 5) ms, below no speculation's 4 / 26 ms."""
    k2_at_1 = 1.75 / (0.024 + 2 * 0.004)  # T(3) = 24 ms
    k2_at_4 = 4 * 1.75 / (0.042 + 2 * 0.005)  # T(12) = 42 ms
    points = [
        Point(0, 1, (1 / 0.020,)),
        Point(0, 4, (4 / 0.026,)),
        Point(2, 1, (k2_at_1,), (0.5, 0.25)),
        Point(2, 4, (k2_at_4,), (0.5, 0.25)),
    ]
    found = predict_schedule(points, [(1, 1, 2), (2, 4, 0)])
    assert found[1] == pytest.approx((k2_at_1,) * 3)
    assert found[4] == pytest.approx((4 / 0.031,) * 3)
    # past the last range vLLM carries its k: [[1,2,2]] serves k=2 at 4 too
    assert predict_schedule(points, [(1, 2, 2)])[4] == pytest.approx((k2_at_4,) * 3)


def _counts(rates: list[float]) -> SpecDecodeCounts:
    drafts = 10_000
    accepted = [round(r * drafts) for r in rates]
    return SpecDecodeCounts(drafts, drafts * len(rates), sum(accepted), tuple(accepted))


def _served(tmp_path: Path, ks: tuple[int, ...], spread: float = 1.0) -> tuple[list, dict]:
    """``predicted_sweep`` on the recorded deeper-toy sweep standing in for servers (each
    round scaled around its mean by ``spread``); returns what was served and the block."""
    from eaglequant.tune.request import TuneRequest
    from eaglequant.tune.sweep import (
        Configuration,
        TuneResult,
        predicted_sweep,
        prediction_block,
    )

    rows = json.loads(DEEP.read_text())["results"]
    served: list[Configuration] = []

    def run(config: Configuration) -> list[TuneResult]:
        served.append(config)
        k = 3 if config.schedule else config.k
        found = []
        for r in rows:
            if r["k"] == k:
                mean = fmean(r["runs"])
                runs = [mean + (x - mean) * spread for x in r["runs"]]
                counts = _counts(r["per_position"]) if k else None
                length = counts.mean_acceptance_length if counts else None
                rates = counts.per_position_rates if counts else []
                c = r["concurrency"]
                found.append(TuneResult(k, c, runs, None, length, rates, config.schedule, counts))
        return found

    request = TuneRequest(target=tmp_path, draft=tmp_path, ks=ks, concurrencies=(1, 4, 8))
    configs = [Configuration(label=f"k{k}", k=k, spec=None) for k in (0, *ks)]
    results, forecast = predicted_sweep(request, configs, run)
    return served, prediction_block(forecast, results, request)


def test_tune_predict_serves_two_servers_then_one_confirmation(tmp_path: Path) -> None:
    """No speculation and k=3 at every concurrency; then at most one more server, the
    predicted recommendation; results.md renders predicted beside measured."""
    from eaglequant.render.reports import tune_markdown

    served, block = _served(tmp_path, (1, 2, 3))
    assert [c.k for c in served[:2]] == [0, 3] and len(served) <= 3
    assert block["server_starts"] == len(served) and block["full_sweep_server_starts"] == 4
    assert block["noisy_measured"] == []
    if block["confirmed"] is None:
        assert set(block["winners"].values()) <= {0, 3} and block["schedule"] is None
    assert all(p["low"] <= p["point"] <= p["high"] for p in block["points"])
    recorded = json.loads(DEEP.read_text())  # written before results.json had a schema version
    summary = recorded | {"schema_version": 2, "kind": "sweep", "prediction": block}
    text = tune_markdown(summary)
    assert "(`tune --predict`)" in text and f"{len(served)} server starts against" in text
    assert "| 3 | 1 |" in text and "fitted" in text


def test_a_noisy_run_measures_what_it_cannot_predict(tmp_path: Path) -> None:
    """The same rounds spread 8x around their means: the predictions the choice rests on
    are too wide, and those ks are served instead of being reported as guesses."""
    served, block = _served(tmp_path, (2, 3), spread=8.0)
    assert block["noisy_measured"], block
    assert {c.k for c in served} >= set(block["noisy_measured"])
    for p in block["points"]:
        if p["k"] in block["noisy_measured"]:
            assert p["measured"] is not None
    # k=2's own counters against k=3's cut to 2 positions (recorded: 2.488 and 2.485)
    checks = block["acceptance_checks"]
    assert {c["k"] for c in checks} == {2} and len(checks) == 3
    assert all(
        c["predicted_length"] == pytest.approx(c["measured_length"], abs=0.01) for c in checks
    )
