"""validate's options before any engine: required prompts, refused tolerances, recipe thresholds."""

from __future__ import annotations

import json
from pathlib import Path

from eaglequant.results.manifest import MANIFEST_FILE, MANIFEST_SCHEMA
from eaglequant.validate.request import validation_spec
from tests.conftest import REPO

MANIFEST_HEAD = {"tool": "eaglequant", "schema_version": MANIFEST_SCHEMA}


def test_a_named_recipe_overrides_the_manifest(tmp_path: Path) -> None:
    recipe_file = tmp_path / "strict.yaml"
    recipe_file.write_text(
        (REPO / "configs" / "fp8-static.yaml")
        .read_text()
        .replace("min_acceptance_ratio: 0.98", "min_acceptance_ratio: 0.995")
    )
    (tmp_path / MANIFEST_FILE).write_text(
        json.dumps(MANIFEST_HEAD | {"recipe": {"validation": {}}})
    )
    assert validation_spec(tmp_path, str(recipe_file)).min_acceptance_ratio == 0.995
