"""validate's gate options before any engine: --against, --junit-xml, the recipe's thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.errors import InputError
from eaglequant.recipe import load_recipe, recipe_from_dict
from tests.conftest import TOY

BASE = ["validate", "--target", str(TOY / "target"), "--draft", str(TOY / "draft")]
BASE += ["--baseline", str(TOY / "draft"), "--prompts", str(TOY / "prompts.jsonl")]


def _error(args: list[str]) -> str:
    result = CliRunner().invoke(main, [*BASE, *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return result.output.strip().splitlines()[-1]


def test_against_a_file_that_is_no_report_is_one_line(tmp_path: Path) -> None:
    foreign = tmp_path / "results.json"
    foreign.write_text(json.dumps({"schema_version": 1, "results": []}))
    assert _error(["--against", str(foreign)]) == (
        f"error: {foreign}: not an eaglequant validation report (kind None); pass a file "
        "written by eaglequant validate --json"
    )


def test_against_a_missing_file_is_one_line() -> None:
    assert _error(["--against", "/nonexistent/v.json"]) == (
        "error: /nonexistent/v.json: cannot read the validation report ([Errno 2] No such file "
        "or directory: '/nonexistent/v.json'); pass the file eaglequant wrote"
    )


@pytest.mark.parametrize("option", ["--junit-xml", "--json", "--markdown"])
def test_a_report_path_in_a_missing_folder_is_refused_first(tmp_path: Path, option: str) -> None:
    path = tmp_path / "missing" / "report"
    assert _error([option, str(path)]) == (
        f"error: {path.parent}: no such folder; create the parent folder first"
    )


def test_the_default_recipe_sets_every_validation_key() -> None:
    validation = load_recipe().validation
    assert (validation.min_position_ratio, validation.max_regression) == (0.95, 0.02)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"min_position_ratio": 0}, "'validation.min_position_ratio' must be in (0, 1.5]"),
        ({"max_regression": 1}, "'validation.max_regression' must be in [0, 1)"),
        ({"max_regression": -0.1}, "'validation.max_regression' must be in [0, 1)"),
        ({"min_acceptance_ratio": 2}, "'validation.min_acceptance_ratio' must be in (0, 1.5]"),
        ({"scale_tolerance": 1}, "'validation.scale_tolerance' must be above 1"),
    ],
)
def test_out_of_range_validation_keys_are_refused(block: dict, message: str) -> None:
    with pytest.raises(InputError) as caught:
        recipe_from_dict({"name": "r", "validation": block}, "r.yaml")
    assert str(caught.value) == f"r.yaml: {message}"
