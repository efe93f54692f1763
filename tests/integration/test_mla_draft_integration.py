"""MLA EAGLE-3 drafts (vLLM's deepseek_eagle3.py): recognised, named, and refused with reasons.

The module-vs-vLLM proof and the real engine's layer check are in
tests/engine/test_draft_equivalence.py; the tensor-by-tensor export in
tests/unit/test_draft_forms.py.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from eaglequant.cli import main
from tests.support import fates_by_name, inspect_json


def test_inspect_of_the_export_predicts_kv_b_proj_bf16(mla_draft: Path, tmp_path: Path) -> None:
    out = tmp_path / "fp8"
    result = CliRunner().invoke(main, ["export", str(mla_draft), str(out), "--calib", "none"])
    assert result.exit_code == 0, result.output
    code, report = inspect_json(out)
    assert code == 0 and report["problems"] == [], report
    fates = fates_by_name(report)
    assert {n for n, (_, quantized, _) in fates.items() if not quantized} == {
        "model.layers.4.self_attn.kv_b_proj",
        "model.fc",
        "lm_head",
    }
    assert fates["model.layers.4.self_attn.kv_b_proj"][2] == "excluded"
    assert fates["model.layers.4.self_attn.fused_qkv_a_proj"][1]
