"""``eaglequant acceptance`` refuses bad input before any engine starts: exit 2, one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from tests.conftest import TOY

pytestmark = pytest.mark.unit

BASE = ["acceptance", "--target", str(TOY / "target"), "--draft", str(TOY / "draft")]
BASE += ["--prompts", str(TOY / "prompts.jsonl")]


def _refused(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_seed_without_temperature() -> None:
    assert _refused([*BASE, "--seed", "1"]) == (
        "error: --seed samples: give --temperature above 0 with it (0 is greedy)"
    )


def test_concurrency_twice() -> None:
    args = [*BASE, "--concurrency", "1", "--engine-arg", "max_num_seqs=2"]
    assert _refused(args) == (
        "error: --concurrency and --engine-arg max_num_seqs both set the requests in flight; "
        "give one"
    )


def test_missing_target(tmp_path: Path) -> None:
    args = ["acceptance", "--target", str(tmp_path / "none"), *BASE[3:]]
    assert _refused(args) == (
        f"error: {tmp_path / 'none'}: no such target folder; pass the target model's folder"
    )


def test_json_into_missing_folder(tmp_path: Path) -> None:
    out = tmp_path / "absent" / "a.json"
    assert _refused([*BASE, "--json", str(out)]) == (
        f"error: {out.parent}: no such folder; create the parent folder first"
    )
    assert not out.parent.exists()


def test_draft_that_is_not_a_draft(tmp_path: Path) -> None:
    args = ["acceptance", "--target", str(TOY / "target"), "--draft", str(tmp_path), *BASE[5:]]
    assert _refused(args) == (
        f"error: {tmp_path / 'config.json'}: missing; a model folder needs its config.json "
        "(copy it from the source model)"
    )
