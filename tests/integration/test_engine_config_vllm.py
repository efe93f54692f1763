"""The engine configuration shared by validate and tune: parsing, checking, platform defaults."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from eaglequant.cli import main
from tests.conftest import TOY, edit_config, tree_digest


def test_validate_refuses_an_unknown_engine_arg_before_any_engine(tmp_path: Path) -> None:
    fake_fp8 = tmp_path / "fp8"
    shutil.copytree(TOY / "draft", fake_fp8)
    edit_config(fake_fp8, quantization_config={"quant_method": "quark"})
    before = tree_digest(tmp_path)
    args = ["validate", "--target", str(TOY / "target"), "--draft", str(fake_fp8)]
    args += ["--baseline", str(TOY / "draft"), "--prompts", str(TOY / "prompts.jsonl")]
    result = CliRunner().invoke(main, [*args, "--engine-arg", "max_num_seq=8"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "error: engine argument 'max_num_seq' is not a vLLM EngineArgs field; "
        "did you mean 'max_num_seqs'?"
    )
    assert "vLLM engine" not in result.output and tree_digest(tmp_path) == before
