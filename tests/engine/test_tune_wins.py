"""tune where speculation wins: the toy drafts on a deeper toy target (same tokens, costlier).

``tune --baseline`` there: the FP8 export of the toy draft against the BF16 toy draft and
no speculation, and the model card carrying the resulting release table.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from statistics import fmean

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from tests.conftest import TOY, toy_prompts_file


@pytest.fixture(scope="module")
def fp8_toy_draft(toy_fp8: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the toy draft's FP8 export, for the card to write into."""
    return shutil.copytree(toy_fp8, tmp_path_factory.mktemp("card") / "draft-fp8")


@pytest.fixture(scope="module")
def comparison_out(
    tmp_path_factory: pytest.TempPathFactory,
    deep_target: Path,
    fp8_toy_draft: Path,
    lean_servers: None,
) -> Path:
    """``tune --baseline`` on the deeper target: the FP8 toy draft against the BF16 toy draft
    and no speculation, k=2, concurrency 1, 3 rotated rounds, servers kept alive."""
    out = tmp_path_factory.mktemp("tune-wins") / "results"
    prompts = toy_prompts_file(out.parent / "prompts.jsonl", 4)
    args = ["tune", "--target", str(deep_target), "--draft", str(fp8_toy_draft)]
    args += ["--baseline", str(TOY / "draft"), "--k", "2", "--concurrency", "1"]
    args += ["--isl", "64", "--osl", "32", "--prompts", str(prompts), "--num-prompts", "4"]
    args += ["--repeats", "3", "--keep-servers", "--serve-arg", "--enforce-eager"]
    # The target's own dtype (BF16): vLLM's quark method does not take float32.
    args += ["--engine-arg", "max_num_seqs=8"]
    result = CliRunner().invoke(main, [*args, "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


def test_baseline_comparison_measures_three_configurations_in_rotated_rounds(
    comparison_out: Path,
) -> None:
    summary = json.loads((comparison_out / "results.json").read_text())
    assert summary["schema_version"] == 2 and summary["kind"] == "comparison"
    labels = ["no speculation", "baseline k=2", "draft k=2"]
    assert summary["rounds"] == [
        {"round": 0, "order": labels},
        {"round": 1, "order": labels[1:] + labels[:1]},
        {"round": 2, "order": labels[2:] + labels[:2]},
    ]
    points = {(p["role"], p["k"]): p for p in summary["points"]}
    assert set(points) == {("no speculation", 0), ("baseline", 2), ("draft", 2)}
    assert [s["label"] for s in summary["server_starts"]] == labels  # kept: one start each
    assert summary["devices"] == 1 and summary["device_unit"] == "CPU worker"
    none = points["no speculation", 0]
    for point in points.values():
        assert len(point["runs"]) == 3 and min(point["runs"]) > 0
        assert point["per_device"] == pytest.approx(fmean(point["runs"]))
        assert point["speedup"] == pytest.approx(fmean(point["runs"]) / fmean(none["runs"]))
        assert point["median_tpot_ms"] > 0 and point["median_ttft_ms"] > 0
    assert none["acceptance"] is None
    for role in ("baseline", "draft"):
        acceptance = points[role, 2]["acceptance"]
        # /metrics deltas, held to the bench's own file in every repeat (the run fails if not).
        assert acceptance["lengths"] == pytest.approx(acceptance["bench_lengths"], rel=1e-9)
        assert acceptance["mean_length"] == pytest.approx(
            1 + acceptance["accepted_tokens"] / acceptance["drafts"]
        )
        assert 1.0 < acceptance["mean_length"] <= 3.0 and len(acceptance["per_position"]) == 2
        assert sum(acceptance["accepted_per_position"]) == acceptance["accepted_tokens"]
        assert acceptance["draft_tokens"] == 2 * acceptance["drafts"]
    # Measured: the BF16 draft about doubles throughput on the deeper target, beyond the spread.
    draft, baseline = points["draft", 2]["runs"], points["baseline", 2]["runs"]
    assert min(baseline) > max(none["runs"])
    (verdict,) = summary["verdicts"]
    assert verdict["baseline_vs_none"] == "baseline"
    assert verdict["draft_vs_baseline"] == _duel(draft, baseline, "draft", "baseline")
    assert verdict["draft_vs_none"] == _duel(draft, none["runs"], "draft", "no speculation")
    draft_wins = min(draft) > max(none["runs"]) and not min(baseline) > max(draft)
    assert verdict["choice"] == ("draft" if draft_wins else "baseline")
    lines = [s["line"] for s in summary["serve_lines"]]
    for line in lines[1:]:  # the same serve arguments, then the speculative config
        assert line.startswith(lines[0] + " --speculative-config ")
    assert summary["environment"]["versions"]["vllm"]
    text = (comparison_out / "results.md").read_text()
    assert (
        "| concurrency | no speculation tok/s per CPU worker | baseline (x no speculation) "
        "| draft (x no speculation) | acceptance length baseline / draft | verdict |"
    ) in text
    assert f"**{verdict['choice']}** ({verdict['text']})" in text
    assert "Controlled: one vLLM build" in text and "- Software: eaglequant" in text
    assert (comparison_out / "speedup.png").read_bytes()[:4] == b"\x89PNG"


def _duel(a: list[float], b: list[float], a_name: str, b_name: str) -> str:
    return a_name if min(a) > max(b) else b_name if min(b) > max(a) else "tie"


def test_the_card_carries_the_release_table(comparison_out: Path, fp8_toy_draft: Path) -> None:
    args = ["card", str(fp8_toy_draft), "--base-model", "toy/target", "--tune", str(comparison_out)]
    card = CliRunner().invoke(main, args)
    assert card.exit_code == 0, card.output
    text = (fp8_toy_draft / "README.md").read_text()
    summary = json.loads((comparison_out / "results.json").read_text())
    none, baseline, draft = summary["points"]  # concurrency 1: no speculation, baseline, draft
    assert "| draft (x no speculation) | acceptance length baseline / draft | verdict |" in text
    cells = [f"| 1 | {none['per_device']:.1f} ["]
    cells += [f"| {p['per_device']:.1f} ({p['speedup']:.2f}x; " for p in (baseline, draft)]
    assert all(cell in text for cell in cells), cells
    assert "Controlled: one vLLM build" in text and "- Software: eaglequant" in text
    # The draft's serve line, with the target named as on the Hub (the card names no path).
    label = summary["serve_lines"][2]["label"]
    shown = [line for line in text.splitlines() if line.startswith(f"- {label}: `vllm serve ")]
    assert len(shown) == 1 and "vllm serve toy/target " in shown[0], shown
    assert '"num_speculative_tokens": 2' in shown[0] and str(TOY) not in shown[0]
    assert (fp8_toy_draft / "speedup.png").is_file() and "](speedup.png)" in text
    # An older results.json (no schema_version) is refused in one line, the card untouched.
    older = comparison_out.parent / "older"
    older.mkdir()
    (older / "results.json").write_text(json.dumps({"target": "t", "results": []}))
    refused = CliRunner().invoke(main, [*args[:-1], str(older)])
    assert refused.exit_code == 2 and refused.output.splitlines()[-1] == (
        "error: tune results.json: no schema_version, kind None; this eaglequant reads "
        "schema_version 2 (sweep or comparison); re-run eaglequant tune"
    )
    assert (fp8_toy_draft / "README.md").read_text() == text


@pytest.fixture(scope="module")
def predicted_out(
    tmp_path_factory: pytest.TempPathFactory, deep_target: Path, lean_servers: None
) -> Path:
    """``tune --predict`` on the deeper target with the BF16 toy draft: k 1, 2, 3 at
    concurrency 1 and 4, 2 repeats."""
    out = tmp_path_factory.mktemp("tune-predict") / "results"
    prompts = toy_prompts_file(out.parent / "prompts.jsonl", 8)
    args = ["tune", "--target", str(deep_target), "--draft", str(TOY / "draft"), "--predict"]
    args += ["--k", "1,2,3", "--concurrency", "1,4", "--isl", "64", "--osl", "32"]
    args += ["--prompts", str(prompts), "--num-prompts", "8", "--repeats", "2"]
    args += ["--serve-arg", "--enforce-eager", "--engine-arg", "max_num_seqs=8"]
    result = CliRunner().invoke(main, [*args, "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


def test_predict_serves_two_servers_and_one_confirmation(predicted_out: Path) -> None:
    """No speculation and k=3 served at both concurrencies, in rounds inside each server,
    every point predicted from them, then at most one confirmation server (the predicted
    recommendation) and one per k too noisy to predict: the server logs count the starts."""
    summary = json.loads((predicted_out / "results.json").read_text())
    prediction = summary["prediction"]
    assert prediction["fitted_on"] == [0, 3] and prediction["full_sweep_server_starts"] == 4
    starts = len(list(predicted_out.glob("serve-*.log")))
    assert starts == prediction["server_starts"] <= 3 + len(prediction["noisy_measured"])
    measured = {(r["k"], r["concurrency"]) for r in summary["results"]}
    assert {(k, c) for k in (0, 3) for c in (1, 4)} <= measured
    for r in summary["results"]:
        assert len(r["runs"]) == 2 and min(r["runs"]) > 0
        if r["k"]:  # acceptance from /metrics, pooled over the rounds
            assert len(r["per_position"]) == r["k"] and 1 < r["acceptance_length"] <= 1 + r["k"]
    assert all(p["low"] <= p["point"] <= p["high"] for p in prediction["points"])
    for p in prediction["points"]:
        assert (p["measured"] is not None) == ((p["k"], p["concurrency"]) in measured), p
    for concurrency, k in summary["recommended_k"].items():
        assert (k, int(concurrency)) in measured
    scheduled = prediction.get("schedule_predicted")
    if prediction["confirmed"] == "schedule":  # served: measured against its prediction
        assert scheduled is not None and set(scheduled["errors"]) == {"1", "4"}
        assert prediction["median_abs_error"] is not None
    text = (predicted_out / "results.md").read_text()
    assert "(`tune --predict`)" in text and f"{starts} server starts against" in text
