"""The engine result's reader: the current schema version is read back, any other refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eaglequant.errors import InputError
from eaglequant.results.engine_result import (
    ENGINE_RESULT_SCHEMA,
    SharedRuns,
    read_engine_result,
    read_shared_runs,
)
from tests.support import engine_result
from tests.unit import recorded_counts as recorded

FIX = "reinstall eaglequant so that its engine child is this version"
CURRENT = engine_result(recorded.FP8_METRICS, [{"histogram": [1, 2, 0, 5], "num_draft_tokens": 24}])


def _written(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "out.json"
    path.write_text(json.dumps(data))
    return path


def _refused(path: Path, reader: Any = read_engine_result) -> str:
    with pytest.raises(InputError) as caught:
        reader(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message.removeprefix(f"{path}: ")


def test_a_current_result_is_read_back_as_written(tmp_path: Path) -> None:
    result = read_engine_result(_written(tmp_path, CURRENT))
    assert result == CURRENT
    assert result["schema_version"] == ENGINE_RESULT_SCHEMA == 1
    assert result["per_request"] == [{"histogram": [1, 2, 0, 5], "num_draft_tokens": 24}]


def test_a_result_without_schema_version_is_refused_naming_the_file(tmp_path: Path) -> None:
    older = {k: v for k, v in CURRENT.items() if k != "schema_version"}
    assert _refused(_written(tmp_path, older)) == (
        f"an engine result without schema_version (an older eaglequant's engine child); {FIX}"
    )


def test_a_result_of_another_schema_version_is_refused_naming_the_file(tmp_path: Path) -> None:
    newer = CURRENT | {"schema_version": ENGINE_RESULT_SCHEMA + 1}
    assert _refused(_written(tmp_path, newer)) == (
        f"engine result schema_version 2, this eaglequant reads 1; {FIX}"
    )


def test_what_is_not_a_result_object_is_refused(tmp_path: Path) -> None:
    assert _refused(_written(tmp_path, [CURRENT])) == "the engine result must be a JSON object"


def test_shared_runs_are_read_back_and_each_run_held_to_the_version(tmp_path: Path) -> None:
    shared: SharedRuns = {
        "schema_version": ENGINE_RESULT_SCHEMA,
        "runs": [CURRENT],
        "refused": None,
    }
    assert read_shared_runs(_written(tmp_path, shared)) == shared
    stale = shared | {"runs": [CURRENT, CURRENT | {"schema_version": 0}]}
    assert _refused(_written(tmp_path, stale), read_shared_runs) == (
        f"engine result schema_version 0, this eaglequant reads 1; {FIX}"
    )
    unversioned = {"runs": [], "refused": "this vLLM lacks drafter.load_model"}
    assert _refused(_written(tmp_path, unversioned), read_shared_runs).startswith(
        "an engine result without schema_version"
    )
