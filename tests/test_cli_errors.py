"""Bad input through the CLI: exit 2, one line naming the problem, nothing written.

The input folder is checked byte for byte afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.recipe import load_recipe
from tests.conftest import edit_config, tree_digest


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output


def _assert_clean_failure(code: int, output: str, pattern: str) -> None:
    assert code == 2, output
    error_lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, output
    assert pattern in error_lines[0], output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "is not an EAGLE-3 Llama draft"),
        ({"num_hidden_layers": 2}, "num_hidden_layers is 2"),
        ({"target_hidden_size": 100}, "tensor 'fc.weight'"),
        ({"hidden_size": None}, "missing key 'hidden_size'"),
    ],
)
def test_export_refuses_bad_draft(
    tiny_draft: Path, tmp_path: Path, change: dict, pattern: str
) -> None:
    edit_config(tiny_draft, **change)
    before = tree_digest(tiny_draft)
    out = tmp_path / "out"
    code, output = _run(["export", str(tiny_draft), str(out), "--calib", "none"])
    _assert_clean_failure(code, output, pattern)
    assert not out.exists()
    assert tree_digest(tiny_draft) == before


def test_config_not_json(tiny_draft: Path, tmp_path: Path) -> None:
    (tiny_draft / "config.json").write_text("{not json")
    code, output = _run(["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none"])
    _assert_clean_failure(code, output, "config.json: not valid JSON")


def test_config_json_not_object(tiny_draft: Path, tmp_path: Path) -> None:
    (tiny_draft / "config.json").write_text("[1, 2]")
    code, output = _run(["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none"])
    _assert_clean_failure(code, output, "must hold a JSON object")


def test_output_inside_input(tiny_draft: Path) -> None:
    code, output = _run(["export", str(tiny_draft), str(tiny_draft / "fp8"), "--calib", "none"])
    _assert_clean_failure(code, output, "may not be the input folder")


def test_output_not_empty(tiny_draft: Path, tmp_path: Path) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, output = _run(["export", str(tiny_draft), str(out), "--calib", "none"])
    _assert_clean_failure(code, output, "pass --overwrite")
    assert (out / "keep.txt").read_text() == "mine"


def test_unparsable_shard_size(tiny_draft: Path, tmp_path: Path) -> None:
    code, output = _run(
        [
            "export",
            str(tiny_draft),
            str(tmp_path / "o"),
            "--calib",
            "none",
            "--max-shard-size",
            "lots",
        ]
    )
    _assert_clean_failure(code, output, "--max-shard-size 'lots'")


def test_static_recipe_without_calibration_source(tiny_draft: Path, tmp_path: Path) -> None:
    code, output = _run(["export", str(tiny_draft), str(tmp_path / "o")])
    _assert_clean_failure(code, output, "a static recipe needs calibration inputs")


@pytest.mark.parametrize(
    ("yaml_text", "pattern"),
    [
        ("name: x\ncalibration:\n  stepz: 3\n", "unknown key 'calibration.stepz'"),
        ("name: x\nweight:\n  granularity: per_block\n", "'weight.granularity' must be one of"),
        ("name: x\ncalibration:\n  samples: many\n", "'calibration.samples' must be int"),
        ("- a list\n", "must be a YAML mapping"),
    ],
)
def test_bad_recipe(tiny_draft: Path, tmp_path: Path, yaml_text: str, pattern: str) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml_text)
    code, output = _run(
        ["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none", "--recipe", str(recipe)]
    )
    _assert_clean_failure(code, output, pattern)


def test_dump_recipe_round_trips() -> None:
    code, output = _run(["export", "unused", "--dump-recipe"])
    assert code == 0
    assert "granularity: per_tensor" in output and "steps: 3" in output
    assert load_recipe().to_dict()["exclude"] == ["fc", "lm_head"]


def test_validate_missing_target(tiny_draft: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    code, output = _run(
        [
            "validate",
            "--target",
            str(tmp_path / "nope"),
            "--draft",
            str(tiny_draft),
            "--baseline",
            str(tiny_draft),
            "--prompts",
            str(prompts),
        ]
    )
    _assert_clean_failure(code, output, "no such target folder")


def test_validate_draft_for_another_target(tiny_draft: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(
        json.dumps({"hidden_size": 128, "vocab_size": 256, "num_hidden_layers": 4})
    )
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    code, output = _run(
        [
            "validate",
            "--target",
            str(target),
            "--draft",
            str(tiny_draft),
            "--baseline",
            str(tiny_draft),
            "--prompts",
            str(prompts),
        ]
    )
    _assert_clean_failure(code, output, "built for target hidden size 64")
