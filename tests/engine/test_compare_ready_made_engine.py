"""``eaglequant compare --candidate`` on the toy pair: a draft ModelOpt's real script wrote
(``tests/producers/toy``), compared as it is, with no recipe and no capture, against the BF16
draft in one engine."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.results.compare_report import read_compare_report, recommend
from eaglequant.results.validation_report import CheckId
from eaglequant.rules.inspection import size_summary
from tests.conftest import REPO, TOY, toy_prompts_file

MODELOPT = REPO / "tests" / "producers" / "toy" / "modelopt-fp8-d2t-repaired"


def test_compare_a_ready_made_modelopt_draft(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    prompts = toy_prompts_file(tmp_path / "prompts.jsonl", 4)
    args = [str(TOY / "draft"), "--target", str(TOY / "target"), "--prompts", str(prompts)]
    args += ["--recipes", "none", "--candidate", f"modelopt={MODELOPT}", "--out", str(out)]
    result = CliRunner().invoke(main, ["compare", *args, "--max-tokens", "16"])
    assert (out / "compare.json").is_file(), result.output
    report = read_compare_report(out / "compare.json")
    (row,) = report.rows
    assert row.recipe == "modelopt" and row.ready_made, row
    assert row.scheme == "NVIDIA ModelOpt: fp8 w:per_tensor a:per_tensor static; BF16: lm_head"
    assert row.bytes_on_disk == size_summary(read_checkpoint(MODELOPT)).bytes_on_disk
    assert row.min_acceptance_ratio == 0.98  # judged by the default recipe's thresholds
    assert CheckId.LAYERS not in row.failed_checks, row  # built as the draft declares
    assert row.lossless and row.mean_acceptance is not None and len(row.per_position) == 3
    assert not (out / "candidates").exists() and not (out / "capture").exists()
    assert report.engine_mode == "single" and report.target_loads == 1, report
    assert set(report.timings_s) == {"engines", "validate.modelopt"}
    choice = recommend(report.rows)
    assert report.recommended == (choice.row.recipe if choice else None)
    assert result.exit_code == (0 if choice else 1), result.output
    assert "| `modelopt` (ready-made) | NVIDIA ModelOpt: fp8" in result.output
    print(result.output, json.dumps(report.timings_s))
