"""compare's recommendation rule, its Markdown table and its input checks, on recorded rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.errors import InputError
from eaglequant.render.compare_tables import compare_markdown
from eaglequant.results.compare_report import (
    COMPARE_SCHEMA_VERSION,
    CandidateRow,
    CompareReport,
    PromptSetSummary,
    Recommendation,
    read_compare_report,
    recommend,
)
from eaglequant.results.spec_counts import AcceptanceRecord
from eaglequant.results.validation_report import CategoryRow, Check, CheckId, RatioInterval
from eaglequant.validate.run_slices import slice_run

MATH = CategoryRow(  # one category, not judged
    prompts=4,
    bf16=AcceptanceRecord(
        mean_length=3.0, per_position=(0.9,), drafts=100, accepted=200, draft_tokens=300
    ),
    fp8=AcceptanceRecord(
        mean_length=2.4, per_position=(0.7,), drafts=100, accepted=140, draft_tokens=310
    ),
)

ROW = CandidateRow(
    recipe="fp8-static",
    scheme="W fp8_e4m3 per_tensor / A fp8_e4m3 per_tensor static",
    kv_cache_dtype="auto (the target's)",
    bytes_on_disk=4_000_000,
    bytes_ratio=0.82,
    quantized_fraction=0.31,
    lossless=True,
    mean_acceptance=3.19,
    per_position=[0.8, 0.6, 0.4],
    acceptance_ratio=0.992,
    min_acceptance_ratio=0.98,
    passed=True,
    failed_checks=[],
    prompt_set="p.jsonl",
)
PTPC = replace(ROW, recipe="ptpc-fp8", bytes_on_disk=4_000_512, mean_acceptance=3.20)
MXFP8 = replace(ROW, recipe="mxfp8", bytes_on_disk=4_000_256, mean_acceptance=3.21)
MXFP4 = replace(
    ROW,
    recipe="mxfp4",
    bytes_on_disk=3_200_000,
    mean_acceptance=2.9,
    acceptance_ratio=0.90,
    passed=False,
    failed_checks=["2 acceptance"],
)


NO_SOURCE = (
    "error: compare calibrates every candidate from one capture: pass --calib-data FILE "
    "(captured from --target) or --calib-hidden-states DIR\n"
)


def _chosen(rows: list[CandidateRow]) -> Recommendation:
    chosen = recommend(rows)
    assert chosen is not None, rows
    return chosen


def test_the_default_is_recommended_over_a_candidate_28_bytes_smaller() -> None:
    dynamic = replace(ROW, recipe="fp8-dynamic", bytes_on_disk=ROW.bytes_on_disk - 28)
    chosen = recommend([dynamic, PTPC, MXFP4, ROW, MXFP8])  # mxfp4 is 20% smaller but fails
    assert chosen is not None and chosen.row == ROW
    assert chosen.reason == (
        "the card's recipe, passing; no other passing candidate is 5% smaller or decidedly "
        "better in acceptance; the smallest other passing candidate, fp8-dynamic, is "
        "28 bytes (under 0.1%) smaller"
    )


def test_a_candidate_8_percent_smaller_wins_with_its_reason() -> None:
    small = replace(MXFP4, passed=True, failed_checks=[], bytes_on_disk=3_680_000)
    smaller = replace(small, recipe="mxfp4-fp8", bytes_on_disk=3_679_972, acceptance_ratio=0.89)
    chosen = recommend([ROW, PTPC, smaller, small])
    assert chosen is not None and chosen.row == small  # 28 bytes do not decide between them
    assert chosen.reason == ("320000 bytes (8.0%) smaller than the default fp8-static, passing")
    assert _chosen([ROW, replace(small, bytes_on_disk=3_810_000)]).row == ROW  # 4.75%


def test_a_candidate_decidedly_better_in_acceptance_wins() -> None:
    code = "humaneval"
    default = [
        replace(ROW, acceptance_interval=RatioInterval(0.990, 0.985, 0.995)),
        replace(ROW, prompt_set=code, acceptance_interval=RatioInterval(0.99, 0.98, 1.0)),
    ]
    better = [
        replace(MXFP8, acceptance_interval=RatioInterval(1.010, 1.000, 1.020)),
        replace(MXFP8, prompt_set=code, acceptance_interval=RatioInterval(0.995, 0.985, 1.005)),
    ]
    chosen = recommend([*default, *better])
    assert chosen is not None and chosen.row == better[0]
    assert chosen.reason == (
        "its acceptance vs BF16 is decidedly above the default fp8-static's: "
        "p.jsonl 1.010 [1.000, 1.020] vs 0.990 [0.985, 0.995]; "
        "humaneval 0.995 [0.985, 1.005] vs 0.990 [0.980, 1.000]"
    )
    overlapping = replace(better[0], acceptance_interval=RatioInterval(1.01, 0.995, 1.02))
    assert _chosen([*default, overlapping, better[1]]).row == default[0]
    worse_elsewhere = replace(better[1], acceptance_interval=RatioInterval(0.97, 0.96, 0.975))
    assert _chosen([*default, better[0], worse_elsewhere]).row == default[0]
    assert _chosen([ROW, replace(MXFP8, acceptance_ratio=1.02)]).row == ROW  # no intervals


def test_without_a_passing_default_the_smallest_passing_candidate_wins() -> None:
    failed = replace(ROW, passed=False, failed_checks=["1 lossless"])
    dynamic = replace(ROW, recipe="fp8-dynamic", bytes_on_disk=4_000_600, acceptance_ratio=0.99)
    chosen = recommend([failed, PTPC, MXFP4, MXFP8, dynamic])
    assert chosen is not None and chosen.row == MXFP8  # all within 5%: the best ratio, smaller
    assert chosen.reason == (
        "the default fp8-static did not pass: the smallest candidate passing (within 5% of its "
        "bytes, the better acceptance vs BF16)"
    )
    assert _chosen([PTPC]).reason.startswith("the default fp8-static was not compared: ")
    assert _chosen([failed, dynamic, replace(PTPC, bytes_on_disk=3_000_000)]).row.recipe == (
        "ptpc-fp8"
    )


def test_none_passing_recommends_nothing() -> None:
    assert recommend([MXFP4, replace(ROW, passed=False)]) is None
    assert recommend([]) is None


def test_a_candidate_must_pass_on_every_prompt_set() -> None:
    code = "humaneval"
    rows = [ROW, PTPC, replace(ROW, prompt_set=code, passed=False), replace(PTPC, prompt_set=code)]
    assert _chosen(rows).row == PTPC  # fp8-static fails on the second set
    assert recommend([*rows, replace(PTPC, prompt_set="mt-bench", passed=False)]) is None


def _run(histograms: list[list[int]], drafted: int = 9, **metrics: object) -> dict:
    per_request = [{"histogram": h, "num_draft_tokens": drafted} for h in histograms]
    pooled = {
        "num_drafts": sum(sum(h) for h in histograms),
        "num_draft_tokens": drafted * len(histograms),
        "num_accepted_tokens": sum(j * c for h in histograms for j, c in enumerate(h)),
        "accepted_per_pos": [sum(sum(h[p + 1 :]) for h in histograms) for p in range(3)],
    }
    result = {
        "token_ids": [[i] for i in range(len(histograms))],
        "top_logprobs": [None] * len(histograms),
        "texts": [str(i) for i in range(len(histograms))],
        "metrics": pooled | metrics,
        "per_request": per_request,
    }
    return {"ok": True, "result": result}


def test_a_prompt_sets_part_of_a_run_has_its_own_outputs_and_counters() -> None:
    run = _run([[1, 1, 0, 1], [0, 0, 0, 3], [3, 0, 0, 0]], prefix_cache_hits=7)
    part = slice_run(run, 1, 3)["result"]
    assert part["token_ids"] == [[1], [2]] and part["texts"] == ["1", "2"]
    assert part["metrics"] == _run([[0, 0, 0, 3], [3, 0, 0, 0]])["result"]["metrics"]
    assert run["result"]["token_ids"] == [[0], [1], [2]]  # the whole run is left as it was
    # check 1's scores, the control's scored again and the prompts: each prompt's own
    scored = {"teacher_forced": [[[[n, 0.0]]] for n in range(3)]}
    scored |= {"control_rescored": [[[[n, 1.0]]] for n in range(3)]}
    scored |= {"prompt_token_ids": [[n] for n in range(3)]}
    run["result"] |= scored
    part = slice_run(run, 1, 3)["result"]
    assert {key: part[key] for key in scored} == {key: v[1:3] for key, v in scored.items()}


def test_a_run_whose_counts_disagree_with_vllm_keeps_vllms_counters() -> None:
    run = _run([[1, 1, 0, 1], [0, 0, 0, 3]], num_accepted_tokens=1)
    part = slice_run(run, 0, 1)["result"]
    assert part["metrics"] == run["result"]["metrics"]  # checks 2 and 5 then fail on it
    target = {"ok": True, "result": {**run["result"], "per_request": None, "metrics": {}}}
    assert slice_run(target, 0, 1)["result"]["metrics"] == {}


def _report(rows: list[CandidateRow], sets: list[PromptSetSummary]) -> CompareReport:
    return CompareReport(
        schema_version=COMPARE_SCHEMA_VERSION,
        baseline="bf16",
        target="t",
        k=3,
        max_tokens=24,
        baseline_bytes=4_900_000,
        prompt_sets=sets,
        rows=rows,
        recommended="fp8-static",
        timings_s={},
        engine_mode="single",
        target_loads=2,
        engine_fallback=None,
    )


SET = PromptSetSummary(
    source="p.jsonl",
    sha256="ab" * 32,
    prompts=8,
    baseline_mean_acceptance=3.214,
    baseline_per_position=[0.8, 0.61, 0.41],
)


def test_markdown_has_one_row_per_candidate_and_the_choice() -> None:
    report = _report([ROW, MXFP4], [SET])
    text = compare_markdown(report)
    assert report.to_json()["schema_version"] == 3 and report.to_json()["tool"] == "eaglequant"
    assert "Engines: single, target loaded 2x." in text
    assert "Prompts `p.jsonl` (8 prompts, sha256 `abababababababab`): BF16 mean acceptance" in text
    assert "| `mxfp4` | W fp8_e4m3 per_tensor / A fp8_e4m3 per_tensor static |" in text
    assert "| 0.900 (>= 0.98) | FAIL (2 acceptance) |" in text
    undecided = replace(MXFP4, verdict="INCONCLUSIVE")
    text_undecided = compare_markdown(replace(report, rows=[ROW, undecided]))
    assert "| INCONCLUSIVE (2 acceptance) |" in text_undecided
    assert "| 4000000 | 0.820 | 31.0% | yes | 3.190 | 0.800 / 0.600 / 0.400 |" in text
    assert text.count("\n| `") == 2
    assert "**Recommended: `fp8-static`**." in text  # a file that states no reason
    reasoned = replace(report, recommendation_reason="the card's recipe, passing")
    assert "**Recommended: `fp8-static`** (the card's recipe, passing)." in (
        compare_markdown(reasoned)
    )
    assert "**No candidate passed.**" in compare_markdown(replace(report, recommended=None))


def test_the_report_reads_back_as_written_and_refuses_another_schema(tmp_path: Path) -> None:
    import json

    categories = {"math": MATH}
    report = _report([ROW, replace(MXFP4, categories=categories)], [SET])
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(report.to_json()))
    assert read_compare_report(path) == report  # every field, rows and sets typed again
    path.write_text(json.dumps(report.to_json() | {"schema_version": 2}))
    with pytest.raises(InputError, match="comparison schema version 2, this eaglequant reads 3"):
        read_compare_report(path)
    path.write_text(json.dumps({k: v for k, v in report.to_json().items() if k != "rows"}))
    with pytest.raises(InputError, match="not a complete comparison"):
        read_compare_report(path)


def test_markdown_has_a_table_per_prompt_set_and_each_candidates_categories() -> None:
    categories = {"math": MATH}
    second = replace(SET, source="/data/sets/mt-bench.jsonl", prompts=80)
    on_second = [
        replace(r, prompt_set=second.source, categories=categories, failure="2 failed")
        for r in (ROW, MXFP4)
    ]
    rows = [ROW, MXFP4, *on_second]
    chosen = _chosen([*rows, replace(PTPC, passed=False)])
    report = replace(_report(rows, [SET, second]), recommendation_reason=chosen.reason)
    text = compare_markdown(report)
    assert "/data/sets" not in text  # a file by its name: the table goes into cards
    assert "- `mxfp4` on `mt-bench.jsonl`: 2 failed" in text
    assert text.count("| candidate | format |") == 2 and text.count("\n| `") == 4
    assert text.index("Prompts `p.jsonl`") < text.index("Prompts `mt-bench.jsonl` (80 prompts")
    assert "`mxfp4` on `mt-bench.jsonl` by category:" in text
    assert "| math | 4 | 300 / 310 | 3.000 | 2.400 | 0.800 | 0.700:0.900 |" in text
    assert "**Recommended: `fp8-static`** (the card's recipe, passing on every prompt set;" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], NO_SOURCE),
        (
            ["--calib-data", "missing.jsonl"],
            "error: missing.jsonl: no such calibration data file\n",
        ),
    ],
)
def test_compare_refuses_before_any_heavy_work(
    tiny_draft: Path,
    tmp_path: Path,
    extra: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "target").mkdir()
    (tmp_path / "p.txt").write_text("x\n")
    args = [str(tiny_draft), "--target", "target", "--prompts", "p.txt", "--out", "out"]
    result = CliRunner().invoke(main, ["compare", *args, "--recipes", "fp8-static,mxfp4", *extra])
    assert result.exit_code == 2
    assert result.output == message
    assert not (tmp_path / "out").exists()


def test_an_unknown_recipe_is_refused(tiny_draft: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("x\n")
    args = [str(tiny_draft), "--target", str(tmp_path), "--prompts", str(tmp_path / "p.txt")]
    result = CliRunner().invoke(
        main, ["compare", *args, "--out", str(tmp_path / "o"), "--recipes", "fp8-static,nvfp4"]
    )
    assert result.exit_code == 2
    assert result.output.startswith("error: recipe 'nvfp4': unknown; use one of [")


def test_a_failed_engine_is_explained_by_its_logs_last_error() -> None:
    from eaglequant.validate.compare import _failure

    checks = [
        Check(CheckId.ENGINES, False, "vLLM engine(s) ['fp8'] failed",
              {"log_tail": {"fp8": "loading\nValueError: no MXFP4 kernel\nexit"}}),
    ]  # fmt: skip
    assert _failure(checks) == "vLLM engine(s) ['fp8'] failed: ValueError: no MXFP4 kernel"
    assert _failure([Check(CheckId.LOSSLESS, True, "ok")]) is None


def test_a_prompt_set_given_twice_is_refused(tiny_draft: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("x\n")
    args = [str(tiny_draft), "--target", str(tmp_path), "--out", str(tmp_path / "o")]
    args += ["--prompts", str(tmp_path / "p.txt"), "--prompts", str(tmp_path / "p.txt")]
    result = CliRunner().invoke(main, ["compare", *args, "--recipes", "fp8-static"])
    assert result.exit_code == 2
    assert (
        result.output
        == f"error: prompt sets {[str(tmp_path / 'p.txt')] * 2}: each set may be given once\n"
    )
    assert not (tmp_path / "o").exists()


def test_a_calibration_free_candidate_is_exported_without_the_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compare hands every calibrated recipe the one capture, and fp8-static-fixed none (its
    export refuses calibration inputs)."""
    from eaglequant.recipe import load_recipe
    from eaglequant.validate import compare as compare_module

    given: dict[str, object] = {}
    monkeypatch.setattr(
        compare_module,
        "export_draft",
        lambda request, _progress: given.update({request.recipe.name: request.calibration}),
    )
    request = compare_module.CompareRequest(
        baseline=tmp_path / "bf16", target=tmp_path / "t", prompt_sets=(), recipes=(),
        out=tmp_path / "out",
    )  # fmt: skip
    for name in ("fp8-static", "fp8-static-fixed"):
        compare_module._export(request, load_recipe(name), tmp_path / "capture", lambda _m: None)
    assert given["fp8-static"].kind == "capture"  # type: ignore[attr-defined]
    assert given["fp8-static"].capture == tmp_path / "capture"  # type: ignore[attr-defined]
    assert given["fp8-static-fixed"].kind == "none"  # type: ignore[attr-defined]


def test_an_engine_request_reads_back_and_refuses_an_unknown_key() -> None:
    from eaglequant.engine.child_request import EngineRequest

    request = EngineRequest(llm={"model": "t"}, prompts=["p"], max_tokens=8, teacher_forced=2)
    assert EngineRequest.from_json(request.to_json()) == request
    with pytest.raises(ValueError, match=r"unknown keys \['logprob_mode'\]: the parent and"):
        EngineRequest.from_json(request.to_json() | {"logprob_mode": "raw"})


def test_a_row_carries_the_intervals_checks_2_and_5_judged(tmp_path: Path) -> None:
    import json

    judged = replace(
        ROW,
        acceptance_interval=RatioInterval(0.992, 0.985, 0.999),
        position_intervals=(RatioInterval(1.0, 0.99, 1.01), RatioInterval(0.98, 0.96, 1.0)),
    )
    report = _report([judged, MXFP4], [SET])
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(report.to_json()))
    assert read_compare_report(path) == report
    text = compare_markdown(report)
    assert (
        "| 0.800 / 0.600 / 0.400 (vs BF16 1.000 [0.990, 1.010] / 0.980 [0.960, 1.000]) "
        "| 0.992 [0.985, 0.999] (>= 0.98) | PASS |" in text
    )
    older = report.to_json()  # a file written before rows carried them reads as without
    for row in older["rows"]:
        del row["acceptance_interval"], row["position_intervals"]
    path.write_text(json.dumps(older))
    assert read_compare_report(path).rows[0].acceptance_interval is None
    assert "| 0.992 (>= 0.98) | PASS |" in compare_markdown(read_compare_report(path))
