"""Shared fixtures: tiny in-code EAGLE-3 drafts (hidden 64) written with safetensors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from eaglequant.synthetic import draft_config, write_random_draft

REPO = Path(__file__).resolve().parent.parent
TOY = REPO / "examples" / "toy"


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file below ``folder`` (to prove inputs are left untouched)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def tiny_draft(tmp_path: Path) -> Path:
    return write_random_draft(tmp_path / "draft", draft_config(), seed=0)


@pytest.fixture
def sharded_draft(tmp_path: Path) -> Path:
    return write_random_draft(tmp_path / "sharded", draft_config(), seed=0, max_shard_size=40_000)


def edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
