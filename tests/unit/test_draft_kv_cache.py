"""``--draft-kv-cache-dtype``: parsed by validate and tune, passed as vLLM's speculative key."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.rules.speculative import schedule_config, speculative_config


def test_speculative_config_carries_the_draft_kv_cache_dtype() -> None:
    assert "kv_cache_dtype" not in speculative_config("d", 3)
    assert speculative_config("d", 3, "fp8")["kv_cache_dtype"] == "fp8"
    assert schedule_config("d", [[1, 4, 3]], "fp8_e4m3")["kv_cache_dtype"] == "fp8_e4m3"


def test_an_unknown_dtype_is_refused_before_any_engine(tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("x\n")
    args = ["--target", str(tmp_path), "--draft", str(tmp_path), "--baseline", str(tmp_path)]
    result = CliRunner().invoke(
        main, ["validate", *args, "--prompts", str(prompts), "--draft-kv-cache-dtype", "int4"]
    )
    assert result.exit_code == 2
    assert "Invalid value for '--draft-kv-cache-dtype': 'int4' is not one of" in result.output
