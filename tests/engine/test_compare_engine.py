"""``eaglequant compare`` end to end on the committed toy pair: one capture, every candidate
exported with real Quark and validated in real vLLM (CPU) against the BF16 draft, on two
prompt sets (the second with categories) served by the same two engines."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.results.compare_report import read_compare_report, recommend
from eaglequant.rules.inspection import inspect_checkpoint
from eaglequant.validate.compare import CANDIDATES_DIR
from tests.conftest import TOY, toy_prompts_file

RECIPES = ("fp8-static", "ptpc-fp8", "fp8-static-channel", "mxfp8", "mxfp4", "mxfp4-fp8")
SCHEMES = {
    "fp8-static": "QuarkW8A8Fp8",
    "ptpc-fp8": "QuarkW8A8Fp8",
    "fp8-static-channel": "QuarkW8A8Fp8",
    "mxfp8": "QuarkOCP_MX",
    "mxfp4": "QuarkOCP_MX",
    "mxfp4-fp8": "QuarkW4A8_MXFP4_FP8",
}


def _categorised(path: Path) -> Path:
    """Four toy prompts from further down the file, in two categories."""
    texts = [
        json.loads(line)["prompt"] for line in toy_prompts_file(path, 12).read_text().splitlines()
    ]
    rows = [
        {"prompt": t, "category": "first" if i < 2 else "second"} for i, t in enumerate(texts[8:])
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_compare_toy_pair(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    prompts = toy_prompts_file(tmp_path / "prompts.jsonl", 8)
    categorised = _categorised(tmp_path / "categorised.jsonl")
    args = [str(TOY / "draft"), "--target", str(TOY / "target"), "--prompts", str(prompts)]
    args += ["--prompts", str(categorised)]
    args += ["--calib-data", str(TOY / "calibration.jsonl"), "--out", str(out)]
    args += [
        "--recipes",
        ",".join(RECIPES),
        "--max-tokens",
        "24",
        "--capture-engine",
        "transformers",
    ]
    result = CliRunner().invoke(main, ["compare", *args], catch_exceptions=False)
    assert (out / "compare.json").is_file(), result.output
    report = read_compare_report(out / "compare.json")
    rows = report.rows
    assert [(row.recipe, row.prompt_set) for row in rows] == [
        (recipe, str(source)) for source in (prompts, categorised) for recipe in RECIPES
    ]
    assert [s.prompts for s in report.prompt_sets] == [8, 4]
    for row in rows:
        assert (row.categories is not None) == (row.prompt_set == str(categorised)), row
        if row.categories:
            assert list(row.categories) == ["first", "second"], row.categories
            assert all(c.prompts == 2 for c in row.categories.values())
    for row in rows:
        fates = inspect_checkpoint(out / CANDIDATES_DIR / row.recipe).fates
        assert {f.vllm_scheme for f in fates if f.quantized} == {SCHEMES[row.recipe]}
        assert 0 < row.bytes_ratio < 1 and 0 < row.quantized_fraction < 1
        assert row.mean_acceptance is not None and len(row.per_position) == 3, row
        assert "3 layers" not in row.failed_checks, row  # built as inspect predicts
        assert row.lossless, row  # the target's greedy output, whatever the draft
    # The BF16 draft and all six candidates, MX ones too (the CPU plugin's MX kernels), swapped
    # into one engine, check 1 teacher-forced in it: the target loaded once.
    assert report.engine_mode == "single" and report.engine_fallback is None, report
    assert report.target_loads == 1
    choice = recommend(rows)
    chosen = choice.row if choice else None
    assert report.recommended == (chosen.recipe if chosen else None)
    assert report.recommendation_reason == (choice.reason if choice else None)
    assert result.exit_code == (0 if chosen else 1), result.output
    assert "| `mxfp4` |" in result.output and "`mxfp4` on `" in result.output
    mxfp4 = next(r for r in rows if r.recipe == "mxfp4")
    fp8 = next(r for r in rows if r.recipe == "fp8-static")
    assert mxfp4.bytes_on_disk < fp8.bytes_on_disk
    if chosen:
        folder = out / CANDIDATES_DIR / chosen.recipe
        card = ["card", str(folder), "--base-model", "toy/target", "--compare", str(out)]
        assert CliRunner().invoke(main, card, catch_exceptions=False).exit_code == 0
        closing = f"**Recommended: `{chosen.recipe}`** ({report.recommendation_reason})."
        assert closing in (folder / "README.md").read_text()
    print(result.output, json.dumps(report.timings_s))
