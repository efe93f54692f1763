"""The toy draft exported with fp8-static-kv and validated in real vLLM: the draft runs with an
FP8 KV cache holding the checkpoint's calibrated K/V scales (check 3 reads them back from
the engine); where vLLM cannot run an FP8 KV cache, validate refuses before any engine with
vLLM's reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.engine.config import probe_vllm
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.validate.layers import checkpoint_kv_scales
from tests.conftest import TOY, toy_prompts_file


def test_a_kv_scaled_draft_runs_with_its_scales_in_an_fp8_kv_cache(tmp_path: Path) -> None:
    draft = tmp_path / "fp8-kv"
    export = ["export", str(TOY / "draft"), str(draft), "--recipe", "fp8-static-kv"]
    export += ["--calib-target", str(TOY / "target"), "--calib-engine", "transformers"]
    export += ["--calib-data", str(TOY / "calibration.jsonl"), "--calib-samples", "16"]
    exported = CliRunner().invoke(main, export, catch_exceptions=False)
    assert exported.exit_code == 0, exported.output
    report_path = tmp_path / "report.json"
    args = ["validate", "--target", str(TOY / "target"), "--draft", str(draft)]
    args += ["--baseline", str(TOY / "draft"), "--max-tokens", "24"]
    args += ["--prompts", str(toy_prompts_file(tmp_path / "p.jsonl", 8))]
    args += ["--capture-engine", "transformers", "--json", str(report_path)]
    result = CliRunner().invoke(main, args)
    refusal = probe_vllm(sys.executable).fp8_kv_cache_refusal
    if refusal:  # an AVX2-only CPU: nothing runs, vLLM's reason is the one line
        assert result.exit_code == 2 and f'("{refusal}"' in result.output, result.output
        assert not report_path.exists()
        return
    assert "its KV cache runs in fp8_e4m3" in result.output, result.output
    report = json.loads(report_path.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    layers = checks["3 layers"]
    assert layers["passed"], layers["detail"]
    assert layers["detail"].endswith("FP8 draft KV cache with the checkpoint's K/V scales (1)")
    [attention] = layers["numbers"]["attention"]
    [(k, v)] = checkpoint_kv_scales(read_checkpoint(draft))
    assert attention["kv_cache_dtype"] == "fp8_e4m3"
    assert (attention["k_scale"], attention["v_scale"]) == (k, v) and k != 1.0
    assert checks["1 lossless"]["passed"] and checks["6 scale plausibility"]["passed"]
    assert checks["2 acceptance"]["numbers"]["fp8"] > 1
    assert '"kv_cache_dtype": "fp8_e4m3"' in report["serve_command"]
    # `acceptance` measures the draft as validate ran it: its KV cache in FP8 too
    measured = tmp_path / "acceptance.json"
    args = ["acceptance", "--target", str(TOY / "target"), "--draft", str(draft)]
    args += ["--prompts", str(tmp_path / "p.jsonl"), "--max-tokens", "24"]
    alone = CliRunner().invoke(main, [*args, "--json", str(measured)])
    assert alone.exit_code == 0, alone.output
    assert "its KV cache runs in fp8_e4m3" in alone.output, alone.output
    speculative = json.loads(measured.read_text())["engine_config"]["llm"]["speculative_config"]
    assert speculative["kv_cache_dtype"] == "fp8_e4m3"
