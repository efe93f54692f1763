"""compare's ready-made candidates (``--candidate [NAME=]DIR``): how they are named, which are
refused before any heavy work, how their format is described, and how their rows are shown
and judged (by the same recommendation rule as the recipes')."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.cli.compare import ready_draft
from eaglequant.errors import InputError
from eaglequant.render.compare_tables import compare_markdown
from eaglequant.results.compare_report import read_compare_report, recommend
from eaglequant.validate.compare import ReadyDraft, ready_scheme
from tests.conftest import REPO, TOY
from tests.unit.test_compare import ROW, SET, _report

FIXTURES = REPO / "tests" / "producers" / "toy"
MODELOPT = FIXTURES / "modelopt-fp8-d2t-repaired"
CT_DYNAMIC = FIXTURES / "ct-fp8-dynamic"


def _compare(tmp_path: Path, baseline: Path, *extra: str) -> tuple[int, str]:
    """``compare`` on the toy pair's BF16 draft (or ``baseline``) with ``extra`` arguments."""
    (tmp_path / "p.txt").write_text("x\n")
    args = [str(baseline), "--target", str(TOY / "target"), "--prompts", str(tmp_path / "p.txt")]
    args += ["--out", str(tmp_path / "out"), *extra]
    result = CliRunner().invoke(main, ["compare", *args])
    assert not (tmp_path / "out").exists(), result.output
    return result.exit_code, result.output


def test_a_ready_made_draft_is_named_by_its_folder_or_the_name_given(tmp_path: Path) -> None:
    assert ready_draft(str(MODELOPT)) == ReadyDraft(name=MODELOPT.name, draft=MODELOPT)
    assert ready_draft(f"modelopt={MODELOPT}") == ReadyDraft(name="modelopt", draft=MODELOPT)
    odd = tmp_path / "a=b" / "draft"  # a path that holds '=' is a folder, not NAME=DIR
    assert ready_draft(str(odd)) == ReadyDraft(name="draft", draft=odd)
    with pytest.raises(InputError, match=r"^--candidate name=: name a folder, NAME=DIR or DIR$"):
        ready_draft("name=")


@pytest.mark.parametrize(
    ("candidate", "message"),
    [
        (
            str(TOY / "draft"),
            "{draft}: ready-made draft 'draft': not quantized (no quantization_config, no "
            "quantized tensor); pass an FP8 draft made from the BF16 draft",
        ),
        (
            f"fp8-static={MODELOPT}",
            f"{MODELOPT}: ready-made draft 'fp8-static': the name is taken (by a recipe, an "
            "engine role or another draft); give it another name",
        ),
        (
            f"bf16={MODELOPT}",
            f"{MODELOPT}: ready-made draft 'bf16': the name is taken (by a recipe, an engine "
            "role or another draft); give it another name",
        ),
        (
            f"my draft={MODELOPT}",
            f"{MODELOPT}: ready-made draft 'my draft': a name of letters, digits, '.', '_', "
            "'+', '-'; name it",
        ),
        (
            str(FIXTURES),
            f"{FIXTURES}: ready-made draft 'toy': no config.json there; pass a quantized "
            "draft's folder",
        ),
    ],
)
def test_a_candidate_that_is_not_a_quantized_draft_is_refused_in_one_line(
    tmp_path: Path, candidate: str, message: str
) -> None:
    code, output = _compare(tmp_path, TOY / "draft", "--recipes", "none", "--candidate", candidate)
    assert code == 2
    assert output == f"error: {message.format(draft=TOY / 'draft')}\n"


def test_a_candidate_of_other_shapes_is_refused(tiny_draft: Path, tmp_path: Path) -> None:
    code, output = _compare(tmp_path, tiny_draft, "--candidate", str(MODELOPT))
    assert code == 2
    assert output.startswith(
        f"error: {MODELOPT}: ready-made draft '{MODELOPT.name}': not a draft of the BF16 "
        "draft's shapes (hidden 256, the BF16 draft's "
    )
    assert output.endswith(f"); pass one quantized from {tiny_draft}\n")
    assert output.count("\n") == 1


def test_a_candidate_given_twice_or_named_as_a_recipe_is_refused(tmp_path: Path) -> None:
    twice = ["--recipes", "none", "--candidate", str(MODELOPT), "--candidate", f"b={MODELOPT}"]
    code, output = _compare(tmp_path, TOY / "draft", *twice)
    assert (code, output) == (
        2,
        f"error: {MODELOPT}: ready-made draft 'b': this folder is given twice; give it once\n",
    )
    copy = tmp_path / "mxfp4"
    shutil.copytree(MODELOPT, copy)
    args = ["--recipes", "mxfp4", "--candidate", str(copy), "--calib-data", "c.jsonl"]
    code, output = _compare(tmp_path, TOY / "draft", *args)
    assert code == 2
    assert output.startswith(f"error: {copy}: ready-made draft 'mxfp4': the name is taken")


def test_only_ready_made_drafts_need_no_calibration_and_refuse_calibration_text(
    tmp_path: Path,
) -> None:
    code, output = _compare(tmp_path, TOY / "draft", "--recipes", "none")
    assert (code, output) == (
        2,
        "error: --recipes: name at least one recipe, e.g. fp8-static,mxfp4, or pass "
        "--candidate DIR\n",
    )
    text = tmp_path / "calib.jsonl"
    code, output = _compare(
        tmp_path, TOY / "draft", "--candidate", str(CT_DYNAMIC), "--calib-data", str(text)
    )
    assert (code, output) == (
        2,
        f"error: {text}: no recipe to calibrate (only ready-made drafts); pass a capture "
        "folder for check 6 (--calib-hidden-states DIR) or neither\n",
    )


def test_a_ready_made_drafts_format_is_what_its_config_declares() -> None:
    assert ready_scheme(MODELOPT) == (
        "NVIDIA ModelOpt: fp8 w:per_tensor a:per_tensor static; BF16: lm_head"
    )
    assert ready_scheme(CT_DYNAMIC) == (
        "llm-compressor (compressed-tensors): fp8 w:channel a:token dynamic; BF16: fc, lm_head"
    )
    assert ready_scheme(FIXTURES / "ct-fp8-block").startswith(
        "llm-compressor (compressed-tensors): fp8 w:block 128x128 a:group dynamic;"
    )


def test_a_ready_made_row_is_marked_read_back_and_judged_by_the_same_rule(
    tmp_path: Path,
) -> None:
    ready = replace(
        ROW,
        recipe="modelopt-fp8-d2t-repaired",
        scheme="NVIDIA ModelOpt: fp8 w:per_tensor a:per_tensor static; BF16: lm_head",
        bytes_on_disk=3_600_000,  # 10% smaller than the default's
        ready_made=True,
    )
    report = _report([ROW, ready], [SET])
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(report.to_json()))
    assert read_compare_report(path) == report
    text = compare_markdown(report)
    assert "| candidate | format |" in text
    assert "| `fp8-static` | W fp8_e4m3" in text
    assert "| `modelopt-fp8-d2t-repaired` (ready-made) | NVIDIA ModelOpt: fp8" in text
    chosen = recommend([ROW, ready])
    assert chosen is not None and chosen.row == ready
    assert chosen.reason == "400000 bytes (10.0%) smaller than the default fp8-static, passing"
    near = replace(ready, bytes_on_disk=3_900_000)  # 2.5% smaller: the default stays
    chosen = recommend([ROW, near])
    assert chosen is not None and chosen.row == ROW
    older = report.to_json()  # a file written before rows said so reads as a recipe's row
    del older["rows"][1]["ready_made"]
    path.write_text(json.dumps(older))
    assert not read_compare_report(path).rows[1].ready_made


def test_what_inspect_finds_wrong_with_a_ready_made_draft_is_said_before_the_engines(
    tmp_path: Path,
) -> None:
    from eaglequant.validate.compare import CompareRequest, _say_problems

    raw = FIXTURES / "modelopt-fp8"  # d2t and t2d cast to BF16 by ModelOpt's script
    request = CompareRequest(
        baseline=TOY / "draft",
        target=TOY / "target",
        prompt_sets=(),
        recipes=(),
        out=tmp_path / "out",
        ready_made=(ReadyDraft(name="raw", draft=raw), ReadyDraft(name="good", draft=MODELOPT)),
    )
    said: list[str] = []
    _say_problems(request, said.append)
    assert [line.split(": tensor ")[0] for line in said] == [
        f"candidate raw: inspect: {raw / 'model.safetensors'}"
    ] * 2
    assert "'d2t': is BF16, not an integer map" in said[0]
    assert "'t2d': is BF16" in said[1]
