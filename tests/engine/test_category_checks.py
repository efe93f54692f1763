"""Per-category acceptance in real vLLM: a draft broken for one category's tokens only.

The toy's FP8 export gets its ``lm_head`` rows rotated among the draft tokens
that only the *tables* prompts' target continuations use (hex codes and
character names of codec tables), so its drafts there name the wrong token
while every other prediction is unchanged: the mean over all prompts (32 code
prompts, 2 tables prompts) still passes check 2 at a ratio of 0.8, the *tables*
category fails it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from eaglequant.capture.run import CaptureEngine
from eaglequant.prompts.format import read_prompts
from eaglequant.results.validation_report import categories_json
from eaglequant.validate.request import ValidateRequest
from eaglequant.validate.validation import run_engine, validate_draft
from tests.conftest import TOY
from tests.exported import rerecord

CODE = read_prompts(TOY / "prompts.jsonl")
TABLES = [
    "values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,",
    "decoding_map.update({\n    0x0080: 0x00c7,     #  LATIN CAPITAL LETTER C WITH CEDILLA\n"
    "    0x0081: 0x00fc,     #  LATIN SMALL LETTER U WITH DIAERESIS\n",
]
CATEGORIES = ["code"] * len(CODE) + ["tables"] * len(TABLES)


def _request(draft: Path) -> ValidateRequest:
    return ValidateRequest(
        target=TOY / "target",
        draft=draft,
        baseline=TOY / "draft",
        prompts=CODE + TABLES,
        categories=CATEGORIES,
        max_tokens=32,
        min_acceptance_ratio=0.8,
        min_position_ratio=0.8,
        min_category_drafts=48,
        engine_timeout_s=300,
        lossless="strict",
        capture=CaptureEngine(name="transformers"),
    )


def _only_in_tables(target: dict[str, Any]) -> list[int]:
    """Target token ids of the tables continuations that no code continuation has."""
    tokens = target["result"]["token_ids"]
    code = {t for ids in tokens[: len(CODE)] for t in ids}
    return sorted({t for ids in tokens[len(CODE) :] for t in ids} - code)


def _rotate_lm_head_rows(draft: Path, target_ids: list[int]) -> int:
    """Rotate the draft's lm_head rows among those target tokens; returns how many."""
    tensors = load_file(str(draft / "model.safetensors"))
    d2t = tensors["d2t"]
    draft_ids = [i for i in range(d2t.numel()) if i + int(d2t[i]) in set(target_ids)]
    rows = torch.tensor(draft_ids)
    tensors["lm_head.weight"][rows] = tensors["lm_head.weight"][rows.roll(1)].clone()
    save_file(tensors, str(draft / "model.safetensors"), metadata={"format": "pt"})
    return len(draft_ids)


def test_a_category_collapse_fails_its_category_while_the_mean_passes(
    toy_fp8: Path, tmp_path: Path
) -> None:
    target = run_engine(_request(toy_fp8), None)
    assert target["ok"], target["log"][-2000:]
    broken = tmp_path / "broken"
    shutil.copytree(toy_fp8, broken)
    assert _rotate_lm_head_rows(broken, _only_in_tables(target)) >= 2
    rerecord(broken)  # validate refuses bytes its manifest does not list
    report = validate_draft(_request(broken), reuse={"target": target})
    checks = {c.name: c for c in report.checks}
    summary = json.dumps(categories_json(report.categories), indent=1)[:3000]
    assert checks["1 lossless"].passed, checks["1 lossless"].detail
    assert checks["2 acceptance"].passed, (checks["2 acceptance"].detail, summary)
    assert not checks["2 acceptance by category"].passed, summary
    assert "FAIL: tables" in checks["2 acceptance by category"].detail
    assert report.categories is not None
    tables, code = report.categories["tables"], report.categories["code"]
    assert tables.judged and tables.checks is not None and tables.checks[0].verdict == "FAIL"
    assert code.judged and code.checks is not None and code.checks[0].verdict != "FAIL"
    assert tables.fp8.mean_length < 0.6 * tables.bf16.mean_length
    assert checks["5 per-position by category"].verdict == "FAIL"
    overlap = {"calibration": str(TOY / "calibration.jsonl"), "shared": 0, "prompts": 34}
    assert report.calibration_overlap == overlap  # held-out prompts: none calibrated on
