"""compare's recommendation rule, its Markdown table and its input checks, on recorded rows."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.render.reports import compare_markdown
from eaglequant.validate.compare import (
    COMPARE_SCHEMA_VERSION,
    CandidateRow,
    CompareReport,
    recommend,
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


def test_the_smallest_passing_candidate_is_recommended() -> None:
    assert recommend([PTPC, MXFP4, ROW, MXFP8]) == ROW  # mxfp4 is smaller but fails


def test_on_equal_size_the_better_acceptance_wins() -> None:
    same = replace(MXFP8, bytes_on_disk=ROW.bytes_on_disk)
    assert recommend([ROW, same]) == same
    assert recommend([same, ROW]) == same


def test_none_passing_recommends_nothing() -> None:
    assert recommend([MXFP4, replace(ROW, passed=False)]) is None
    assert recommend([]) is None


def test_markdown_has_one_row_per_candidate_and_the_choice() -> None:
    report = CompareReport(
        schema_version=COMPARE_SCHEMA_VERSION,
        baseline="bf16",
        target="t",
        prompts=8,
        k=3,
        max_tokens=24,
        baseline_bytes=4_900_000,
        baseline_mean_acceptance=3.214,
        baseline_per_position=[0.8, 0.61, 0.41],
        rows=[ROW, MXFP4],
        recommended="fp8-static",
        timings_s={},
        engine_mode="single",
        target_loads=2,
        engine_fallback=None,
    ).to_json()
    text = compare_markdown(report)
    assert report["schema_version"] == 2 and report["tool"] == "eaglequant"
    assert "Engines: single, target loaded 2x." in text
    assert "| `mxfp4` | W fp8_e4m3 per_tensor / A fp8_e4m3 per_tensor static |" in text
    assert "| 0.900 (>= 0.98) | FAIL (2 acceptance) |" in text
    undecided = replace(MXFP4, verdict="INCONCLUSIVE")
    rows = [asdict(r) for r in (ROW, undecided)]
    assert "| INCONCLUSIVE (2 acceptance) |" in compare_markdown({**report, "rows": rows})
    assert "| 4000000 | 0.820 | 31.0% | yes | 3.190 | 0.800 / 0.600 / 0.400 |" in text
    assert text.count("\n| `") == 2
    assert "**Recommended: `fp8-static`**" in text
    assert "**No candidate passed.**" in compare_markdown({**report, "recommended": None})


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
        {"name": "engines", "passed": False, "detail": "vLLM engine(s) ['fp8'] failed",
         "numbers": {"log_tail": {"fp8": "loading\nValueError: no MXFP4 kernel\nexit"}}},
    ]  # fmt: skip
    assert _failure(checks) == "vLLM engine(s) ['fp8'] failed: ValueError: no MXFP4 kernel"
    assert _failure([{"name": "1 lossless", "passed": True, "detail": "ok"}]) is None
