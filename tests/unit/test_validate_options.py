"""validate's options before any engine: required prompts, refused tolerances, recipe thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.errors import InputError
from eaglequant.recipe import ValidationSpec
from eaglequant.results.manifest import MANIFEST_FILE, MANIFEST_SCHEMA
from eaglequant.validate.request import validation_spec
from tests.conftest import TOY

BASE = ["validate", "--target", str(TOY / "target"), "--draft", str(TOY / "draft")]
BASE += ["--baseline", str(TOY / "draft")]


MANIFEST_HEAD = {"tool": "eaglequant", "schema_version": MANIFEST_SCHEMA}


def test_prompts_are_required() -> None:
    result = CliRunner().invoke(main, BASE)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == "Error: Missing option '--prompts'."


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--scale-tolerance", "0", "0.0 is not in the range x>1."),
        ("--scale-tolerance", "1", "1.0 is not in the range x>1."),
        ("--min-acceptance-ratio", "0", "0.0 is not in the range 0<x<=1.5."),
    ],
)
def test_out_of_range_thresholds_are_refused_not_replaced(
    option: str, value: str, message: str
) -> None:
    prompts = ["--prompts", str(TOY / "prompts.jsonl")]
    result = CliRunner().invoke(main, [*BASE, *prompts, option, value])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == f"Error: Invalid value for '{option}': {message}"


def test_thresholds_come_from_the_recipe_the_draft_was_exported_with(tmp_path: Path) -> None:
    assert validation_spec(tmp_path, None) == ValidationSpec(0.98, 1.25)  # fp8-static's block
    recipe = {"name": "custom", "validation": {"min_acceptance_ratio": 0.9, "scale_tolerance": 8}}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(MANIFEST_HEAD | {"recipe": recipe}))
    assert validation_spec(tmp_path, None) == ValidationSpec(0.9, 8)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"recipe": {}}, "not an eaglequant export manifest (no 'tool': 'eaglequant')"),
        ({"tool": "eaglequant", "recipe": {}}, "export manifest schema version None"),
        (MANIFEST_HEAD | {"schema_version": 99}, "export manifest schema version 99"),
    ],
)
def test_a_foreign_or_older_manifest_is_one_line(
    tmp_path: Path, manifest: dict[str, object], message: str
) -> None:
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="re-export the draft") as caught:
        validation_spec(tmp_path, None)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_seed_without_a_temperature_is_refused() -> None:
    prompts = ["--prompts", str(TOY / "prompts.jsonl")]
    result = CliRunner().invoke(main, [*BASE, *prompts, "--seed", "1"])
    assert result.exit_code == 2
    assert result.output == (
        "error: --seed samples: give --temperature above 0 with it (0 is greedy)\n"
    )
