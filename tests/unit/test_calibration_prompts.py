"""Calibration from prompt sources: what was used is recorded, and validate sees the overlap."""

from __future__ import annotations

import json
from pathlib import Path

from eaglequant.capture.sequences import tokenize_data
from eaglequant.prompts.format import read_prompts, text_hash
from eaglequant.prompts.source import PromptSource
from eaglequant.results.manifest import MANIFEST_FILE
from eaglequant.validate.request import calibration_overlap
from tests.conftest import TOY, toy_prompts_file


def test_calibration_records_the_texts_it_packed(tmp_path: Path) -> None:
    data = toy_prompts_file(tmp_path / "calib.jsonl", 12, key="text")
    tokenized = tokenize_data(TOY / "target", PromptSource(path=data), 16, 3, False)
    record = tokenized.provenance
    texts = read_prompts(data)
    assert len(tokenized.sequences) == 3 and all(len(s) == 16 for s in tokenized.sequences)
    assert record["source"] == str(data) and 1 <= record["texts"] < len(texts)
    assert record["text_hashes"] == [text_hash(t) for t in texts[: record["texts"]]]


def test_validate_counts_prompts_the_draft_was_calibrated_on(tmp_path: Path) -> None:
    prompts = read_prompts(TOY / "prompts.jsonl")[:6]
    data = {"source": "x.jsonl", "text_hashes": [text_hash(t) for t in prompts[2:4]]}
    calibration = {"kind": "target", "capture": {"data": data}}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"calibration": calibration}))
    assert calibration_overlap(tmp_path, prompts) == {
        "calibration": "x.jsonl",
        "shared": 2,
        "prompts": 6,
    }
    old = {"calibration": {"capture": {"data": "calib.jsonl"}}}  # before text hashes
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(old))
    assert calibration_overlap(tmp_path, prompts) is None
    assert calibration_overlap(tmp_path / "none", prompts) is None
