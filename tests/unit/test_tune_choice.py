"""tune's recommendation on recorded measurements: noise, ties, the schedule, the reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.tune.choice import (
    beats,
    best_single,
    schedule_from_winners,
    schedule_misses,
    schedule_problem,
    winner,
)
from eaglequant.tune.report import write_reports
from eaglequant.tune.sweep import TuneRequest, TuneResult, summarize, to_result
from tests.conftest import TOY

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _results(table: dict[int, dict[int, list[float]]]) -> list[TuneResult]:
    return [
        TuneResult(
            k=k,
            concurrency=c,
            runs=runs,
            mean_tpot_ms=None,
            acceptance_length=1.5 if k else None,
            per_position=[0.5] * k,
        )
        for c, by_k in table.items()
        for k, runs in by_k.items()
    ]


REQUEST = TuneRequest(
    target=TOY / "target", draft=TOY / "draft", ks=(2, 4), concurrencies=(1, 8), isl=64, osl=64
)


SWEEP = {
    1: {0: [104.0, 105.0, 103.0], 2: [62.0, 63.0, 61.0], 4: [49.0, 50.0, 48.0]},
    8: {0: [300.0, 302.0, 298.0], 2: [340.0, 338.0, 342.0], 4: [320.0, 330.0, 325.0]},
}


def _schedule_run(at_1: list[float], at_8: list[float]) -> list[TuneResult]:
    runs = {1: at_1, 8: at_8}
    return [
        TuneResult(
            k=2, concurrency=c, runs=r, mean_tpot_ms=None, acceptance_length=None, schedule=True
        )
        for c, r in runs.items()
    ]


def test_beats_only_beyond_the_spread() -> None:
    assert beats([105, 106, 107], [100, 101, 104])
    assert not beats([104, 106, 107], [100, 101, 104])  # ranges touch: a tie
    assert not beats([100, 101, 104], [105, 106, 107])


def test_no_speculation_where_no_k_beats_it() -> None:
    # The measurement at concurrency 1: every k slower.
    assert winner({0: [104.5, 103.9, 105.2], 2: [62.6, 61.8, 63.0], 4: [49.3, 48.7, 50.1]}) == 0
    # Faster on average but inside no speculation's noise: still no speculation.
    assert winner({0: [100.0, 90.0, 110.0], 2: [108.0, 104.0, 109.0]}) == 0


def test_a_clear_win_is_recommended() -> None:
    assert winner({0: [100.0, 101.0, 99.0], 2: [112.0, 113.0, 111.0], 4: [90.0, 91.0, 92.0]}) == 2


def test_a_tie_between_ks_goes_to_the_smaller_k() -> None:
    runs = {0: [100.0, 101.0, 99.0], 2: [120.0, 124.0, 121.0], 4: [122.0, 125.0, 123.0]}
    assert winner(runs) == 2  # k=4 is faster on average but its range overlaps k=2's
    runs[4] = [130.0, 131.0, 132.0]
    assert winner(runs) == 4  # now beyond the spread


def test_a_k_tied_with_the_best_but_not_beating_no_speculation_is_not_chosen() -> None:
    # k=2 overlaps k=4, but only k=4 clears no speculation's range.
    assert winner({0: [100.0, 102.0], 2: [101.0, 106.0], 4: [103.0, 107.0]}) == 4


def test_schedule_ranges_from_winners() -> None:
    assert schedule_from_winners({1: 0, 8: 2}) == [(1, 1, 0), (2, 8, 2)]
    assert schedule_from_winners({64: 4, 4: 8, 16: 8, 1: 8}) == [(1, 16, 8), (17, 64, 4)]
    assert schedule_from_winners({4: 0, 8: 0}) == [(1, 8, 0)]


def test_a_schedule_without_speculation_is_refused() -> None:
    assert schedule_problem([(1, 8, 0)]) == (
        "every k is 0: that is no speculation, which the sweep measures anyway"
    )


def test_schedule_holds_unless_a_winner_beats_it() -> None:
    winners = {1: [100.0, 101.0], 8: [300.0, 310.0]}
    assert schedule_misses({1: [99.0, 100.5], 8: [305.0, 309.0]}, winners) == []
    assert schedule_misses({1: [90.0, 95.0], 8: [305.0, 309.0]}, winners) == [1]


def test_best_single_prefers_matching_the_winners_then_speed() -> None:
    sweep = {
        1: {0: [100.0, 101.0], 2: [60.0, 62.0], 4: [50.0, 51.0]},
        8: {0: [300.0, 301.0], 2: [340.0, 352.0], 4: [350.0, 352.0]},
    }
    # Both ks tie the winner (k=2) at 8 and lose at 1: the faster one overall wins.
    assert best_single(sweep, (2, 4)) == 2  # geometric mean 0.84 beats 0.76
    # No speculation matches the winner at 1 as each k matches it at 8; 1.0 beats 0.84.
    assert best_single(sweep, (0, 2, 4)) == 0
    sweep[8][4] = [360.0, 362.0]
    assert best_single(sweep, (2, 4)) == 4  # now the winner at 8: matching comes first


def test_summary_recommends_a_schedule_that_held_and_reports_it(tmp_path: Path) -> None:
    results = _results(SWEEP) + _schedule_run([103.5, 104.5, 102.0], [339.0, 341.0, 337.0])
    summary = summarize(REQUEST, results, 200)
    assert summary["recommended_k"] == {"1": 0, "8": 2}
    assert summary["schedule"]["ranges"] == [[1, 1, 0], [2, 8, 2]]
    assert summary["recommendation"]["schedule"] and summary["recommendation"]["k"] == 2
    assert (
        '"num_speculative_tokens_per_batch_size": [[1, 1, 0], [2, 8, 2]]'
        in (summary["serve_command"])
    )
    write_reports(tmp_path, summary)
    assert json.loads((tmp_path / "results.json").read_text()) == summary
    text = (tmp_path / "results.md").read_text()
    assert "| 1 | 104.0 [103.0-105.0] | 62.0 [61.0-63.0] (0.60x) |" in text
    assert "103.3 [102.0-104.5] (0.99x) | no speculation |" in text
    assert "**Recommended: the schedule [[1, 1, 0], [2, 8, 2]]**" in text
    for name in ("throughput.png", "speedup.png", "acceptance.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_summary_falls_back_to_the_best_single_choice_when_the_schedule_slips() -> None:
    # At concurrency 1 the schedule (k=0 there, but the draft loaded) fell well behind.
    results = _results(SWEEP) + _schedule_run([90.0, 91.0, 92.0], [339.0, 341.0, 337.0])
    choice = summarize(REQUEST, results, 200)["recommendation"]
    assert not choice["schedule"]
    assert choice["reason"].startswith("the schedule fell behind no speculation at concurrency 1")
    assert choice["k"] == 0  # geometric mean of k=2 (0.60x, 1.13x) is below 1


def test_a_schedule_that_slipped_once_is_recommended_where_it_stands_above_every_single_k() -> None:
    """The real pair's ``tune --predict`` on a 2-core EPYC: the schedule (k=2 at 1, k=1 up to
    4, k=0 above) came in behind no speculation at 16 only, 1.44x ahead at 1 and tied at 4;
    no speculation and k=8 each match the winners at fewer concurrencies or run slower across
    them, so the schedule is recommended, with why."""
    sweep = {
        1: {0: [32.9, 34.0], 8: [35.6, 42.9]},
        4: {0: [120.6, 123.8], 8: [73.9, 78.8]},
        16: {0: [226.9, 235.7], 8: [94.9, 98.1]},
    }
    at = {1: [46.2, 50.1], 4: [117.4, 122.3], 16: [199.9, 203.1]}
    scheduled = [
        TuneResult(
            k=2, concurrency=c, runs=runs, mean_tpot_ms=None, acceptance_length=None, schedule=True
        )
        for c, runs in at.items()
    ]
    request = TuneRequest(
        target=TOY / "target", draft=TOY / "draft", ks=(8,), concurrencies=(1, 4, 16)
    )
    ranges = [(1, 1, 2), (2, 4, 1), (5, 16, 0)]
    summary = summarize(request, _results(sweep) + scheduled, 200, served=ranges)
    choice = summary["recommendation"]
    assert (choice["choice"], choice["k"], choice["schedule"]) == ("schedule", 2, True)
    assert choice["reason"] == (
        "the schedule fell behind no speculation at concurrency 16, yet it ties or beats the "
        "winners at 2 concurrencies and runs at 1.07x no speculation (geometric mean), where "
        "the best single choice, no speculation, does at 2 and 1.00x"
    )
    assert (
        '"num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 4, 1], [5, 16, 0]]'
        in (summary["serve_command"])
    )


def test_no_schedule_is_served_where_one_choice_won_everywhere() -> None:
    losing = {c: {0: runs[0], 2: [r / 2 for r in runs[0]]} for c, runs in SWEEP.items()}
    request = TuneRequest(target=TOY / "target", draft=TOY / "draft", ks=(2,), concurrencies=(1, 8))
    summary = summarize(request, _results(losing), 200)
    assert summary["recommendation"] == {
        "choice": "none",
        "k": 0,
        "schedule": False,
        "reason": "no k beat no speculation beyond the run-to-run spread anywhere",
    }
    assert not summary["schedule"]["measured"] and summary["schedule"]["serve_command"] is None
    assert "--speculative-config" not in summary["serve_command"]


def test_a_point_averages_its_rounds_and_pools_their_counters() -> None:
    plain = to_result(
        0, 1, [({"output_throughput": 10.0}, None), ({"output_throughput": 14.0}, None)], False
    )
    assert (plain.runs, plain.output_throughput, plain.acceptance_length) == (
        [10.0, 14.0],
        12.0,
        None,
    )
    samples = [
        ({"output_throughput": 9.0, "mean_tpot_ms": 3.0}, SpecDecodeCounts(10, 20, 12, (7, 5))),
        ({"output_throughput": 11.0}, SpecDecodeCounts(30, 60, 20, (17, 3))),
    ]
    point = to_result(2, 8, samples, True)
    # 40 drafts, 32 accepted: 1 + 32/40; by position 24/40 and 8/40
    assert (point.mean_tpot_ms, point.acceptance_length, point.per_position) == (
        3.0,
        pytest.approx(1.8),
        pytest.approx([0.6, 0.2]),
    )
    assert point.counts == SpecDecodeCounts(40, 80, 32, (24, 8)) and point.schedule


def test_a_given_schedule_is_reported_even_where_one_choice_won_everywhere() -> None:
    losing = {c: {0: runs[0], 2: [r / 2 for r in runs[0]]} for c, runs in SWEEP.items()}
    request = TuneRequest(
        target=TOY / "target",
        draft=TOY / "draft",
        ks=(2,),
        concurrencies=(1, 8),
        schedule=((1, 1, 0), (2, 8, 2)),
    )
    scheduled = _schedule_run([90.0, 91.0, 92.0], [299.0, 301.0, 300.0])
    summary = summarize(request, _results(losing) + scheduled, 200)
    assert summary["schedule"]["given"] and summary["schedule"]["measured"]
    assert summary["recommendation"]["choice"] == "none"
    assert summary["recommendation"]["reason"] == (
        "no k beat no speculation beyond the run-to-run spread anywhere; "
        "the schedule fell behind no speculation at concurrency 1"
    )


def test_a_schedule_predict_did_not_serve_is_not_recommended_as_held() -> None:
    """``tune --predict`` served no schedule (predicted to fall behind): the measured winners
    differ, yet nothing measured the schedule, so the best single choice is recommended with
    the prediction's reason, never "the schedule held"."""
    why = "the schedule was predicted to fall behind k=2 at concurrency 8, so it was not served"
    summary = summarize(REQUEST, _results(SWEEP), 200, unserved=why)
    choice = summary["recommendation"]
    assert not choice["schedule"] and not summary["schedule"]["measured"]
    assert (
        choice["reason"]
        == f"{why}; no speculation is the best single choice across the concurrencies"
    )
    assert summary["schedule"]["not_measured_because"] == why


def test_under_data_parallelism_the_schedule_is_not_served_and_the_best_single_k_wins() -> None:
    """vLLM turns per-batch-size schedules off with data_parallel_size > 1: the sweep says so
    and recommends the best single choice instead of a schedule it could not measure."""
    from dataclasses import replace

    from eaglequant.engine.config import EngineOptions

    request = replace(REQUEST, engine=EngineOptions(engine_args={"data_parallel_size": 2}))
    summary = summarize(request, _results(SWEEP), 200)
    assert summary["schedule"]["not_measured_because"] == (
        "vLLM turns per-batch-size schedules off under data parallelism"
    )
    assert not summary["schedule"]["measured"] and not summary["recommendation"]["schedule"]
    assert "num_speculative_tokens_per_batch_size" not in summary["serve_command"]
    assert summary["recommendation"]["reason"].startswith(
        "vLLM turns per-batch-size schedules off under data parallelism; "
    )


def test_the_results_name_a_prompt_set_as_given_not_its_cached_file(tmp_path: Path) -> None:
    """Results are published: a set's file lies in this machine's cache, so its name is kept."""
    from dataclasses import replace

    from eaglequant.tune.request import workload

    cached = tmp_path / "cache" / "prompts" / "files" / "mt-bench-all.jsonl"
    named = replace(REQUEST, prompts=cached, prompts_source="mt-bench")
    assert workload(named, 256)["prompts"] == "mt-bench"
    given = replace(REQUEST, prompts=Path("prompts.jsonl"))
    assert workload(given, 256)["prompts"] == "prompts.jsonl"
