"""Validation with real vLLM (CPU) on the committed toy pair and the project's own FP8 export.

The target-only and BF16-draft engine runs are made once and reused for every
FP8 variant, so each variant costs one engine start (~20-40 s on 2 cores).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eaglequant.cli import main
from eaglequant.validate.validate import (
    ValidateRequest,
    acceptance,
    read_prompts,
    run_engine,
    validate,
)
from tests.conftest import TOY

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PROMPTS = 8
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def good_fp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "fp8"
    result = CliRunner().invoke(
        main,
        [
            "export",
            str(TOY / "draft"),
            str(out),
            "--calib-target",
            str(TOY / "target"),
            "--calib-data",
            str(TOY / "calibration.jsonl"),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return out


def _request(draft: Path) -> ValidateRequest:
    return ValidateRequest(
        target=TOY / "target",
        draft=draft,
        baseline=TOY / "draft",
        prompts=read_prompts(TOY / "prompts.jsonl")[:PROMPTS],
        max_tokens=MAX_TOKENS,
        engine_timeout_s=300,
    )


@pytest.fixture(scope="module")
def shared_engines(good_fp8: Path) -> dict[str, dict[str, Any]]:
    request = _request(good_fp8)
    return {"target": run_engine(request, None), "bf16": run_engine(request, TOY / "draft")}


def _failed(report: Any) -> set[str]:
    return {c.name.split()[0] for c in report.checks if not c.passed}


def _variant(good: Path, tmp_path: Path, edit: Any) -> Path:
    variant = tmp_path / "variant"
    shutil.copytree(good, variant)
    tensors = load_file(str(variant / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(variant / "model.safetensors"), metadata={"format": "pt"})
    return variant


def test_good_fp8_draft_passes(good_fp8: Path, shared_engines: dict, tmp_path: Path) -> None:
    report = validate(_request(good_fp8), reuse=shared_engines)
    assert report.passed, [(c.name, c.detail) for c in report.checks]
    bf16 = report.engines["bf16"]["acceptance"]["mean_length"]
    fp8 = report.engines["fp8"]["acceptance"]["mean_length"]
    assert bf16 > 1.8 and fp8 >= 0.98 * bf16
    assert report.plugin_active and report.backend == "cpu"
    report_path = tmp_path / "validation.json"
    report_path.write_text(json.dumps(report.to_json()))
    card = CliRunner().invoke(
        main,
        ["card", str(good_fp8), "--base-model", "toy/target", "--validation", str(report_path)],
    )
    assert card.exit_code == 0, card.output
    text = (good_fp8 / "README.md").read_text()
    assert f"| FP8 | {fp8:.3f} |" in text and f"| BF16 | {bf16:.3f} |" in text
    assert "| 6 scale plausibility | PASS |" in text


def test_bare_exclude_fails_acceptance_layers_and_log(
    good_fp8: Path, shared_engines: dict, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(good_fp8, bare)
    config = json.loads((bare / "config.json").read_text())
    config["quantization_config"]["exclude"] = ["fc", "lm_head"]
    (bare / "config.json").write_text(json.dumps(config))
    report = validate(_request(bare), reuse=shared_engines)
    assert {"2", "3", "4"} <= _failed(report), [(c.name, c.detail) for c in report.checks]
    layers = next(c for c in report.checks if c.name.startswith("3"))
    assert "model.fc built as QuarkW8A8Fp8" in layers.detail


@pytest.mark.parametrize(
    ("label", "edit"),
    [
        (
            "input_scale x1000",
            lambda t: [
                t.__setitem__(k, v * 1000) for k, v in list(t.items()) if k.endswith("input_scale")
            ],
        ),
        (
            "input_scale /1000",
            lambda t: [
                t.__setitem__(k, v / 1000) for k, v in list(t.items()) if k.endswith("input_scale")
            ],
        ),
        (
            "weight_scale x10",
            lambda t: [
                t.__setitem__(k, v * 10) for k, v in list(t.items()) if k.endswith("weight_scale")
            ],
        ),
        ("input_scale removed", lambda t: t.pop("midlayer.mlp.down_proj.input_scale")),
    ],
)
def test_corrupted_scales_fail_plausibility(
    good_fp8: Path, shared_engines: dict, tmp_path: Path, label: str, edit: Any
) -> None:
    report = validate(_request(_variant(good_fp8, tmp_path, edit)), reuse=shared_engines)
    assert "6" in _failed(report), (label, [(c.name, c.detail) for c in report.checks])


def test_random_weight_draft_has_acceptance_near_one(tmp_path: Path) -> None:
    from eaglequant.devtools.synthetic import write_random_draft
    from eaglequant.io.checkpoint import read_checkpoint

    config = read_checkpoint(TOY / "draft").config
    random_draft = write_random_draft(tmp_path / "random", config, seed=3)
    engine = run_engine(_request(random_draft), random_draft)
    assert engine["ok"], engine["log"][-2000:]
    mean = acceptance(engine["result"]["metrics"])["mean_length"]
    assert 1.0 <= mean < 1.2, mean


def test_engine_timeout_is_a_failed_check_with_log(good_fp8: Path, shared_engines: dict) -> None:
    request = _request(good_fp8)
    request = ValidateRequest(**{**request.__dict__, "engine_timeout_s": 3})
    report = validate(request, reuse=shared_engines)
    engines = next(c for c in report.checks if c.name == "engines")
    assert not engines.passed and "timed out" in engines.detail
    assert report.engines["fp8"]["timed_out"]


def test_engine_crash_is_a_failed_check_with_log_tail(
    good_fp8: Path, shared_engines: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "100000")  # more KV cache than the machine has
    report = validate(_request(good_fp8), reuse=shared_engines)
    engines = next(c for c in report.checks if c.name == "engines")
    assert not engines.passed and "['fp8'] failed" in engines.detail
    assert report.engines["fp8"]["returncode"] != 0 and not report.engines["fp8"]["timed_out"]
    assert report.engines["fp8"]["log_tail"].strip()
