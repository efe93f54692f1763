"""CLI: inspect and fix-config through Click's CliRunner (exit codes, messages)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from tests.conftest import TOY, edit_config, tree_digest
from tests.foreign import MIDLAYER, quantize_layers


def _fp8_config(folder: Path, exclude: list[str]) -> None:
    quantize_layers(folder, MIDLAYER, static_input=True)
    spec = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}
    edit_config(
        folder,
        quantization_config={
            "quant_method": "quark",
            "exclude": exclude,
            "global_quant_config": {"weight": spec, "input_tensors": spec, "output_tensors": None},
            "layer_quant_config": {},
            "export": {"kv_cache_group": []},
        },
    )


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys; from eaglequant.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'quark', 'vllm', 'transformers', 'safetensors') "
        "if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_inspect_clean_bf16_draft(tiny_draft: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(tiny_draft)])
    assert result.exit_code == 0, result.output
    assert "no problems found" in result.output
    assert "model.layers.32.self_attn.qkv_proj" in result.output


def test_inspect_json(tiny_draft: Path) -> None:
    result = CliRunner().invoke(
        main, ["inspect", str(tiny_draft), "--json", "--target-layers", "4"]
    )
    data = json.loads(result.output)
    assert data["tensor_count"] == 16
    assert data["fates"][0]["vllm_name"] == "model.layers.4.self_attn.qkv_proj"


def test_inspect_unreadable_input_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "no such folder" in result.output


def test_bare_fc_exclude_is_reported_and_fix_config_repairs_it(tiny_draft: Path) -> None:
    _fp8_config(tiny_draft, ["fc", "lm_head"])
    runner = CliRunner()
    result = runner.invoke(main, ["inspect", str(tiny_draft)])
    assert result.exit_code == 1
    assert (
        "exclude entry 'fc' matches no vLLM module; vLLM would quantize model.fc" in result.output
    )
    # into a pipe, a problem line is never wrapped: its command stays whole, to be pasted
    line = next(line for line in result.output.splitlines() if "exclude entry 'fc'" in line)
    assert len(line) > 160 and line.endswith(f"run `eaglequant fix-config {tiny_draft}`")

    fixed = runner.invoke(main, ["fix-config", str(tiny_draft)])
    assert fixed.exit_code == 0, fixed.output
    config = json.loads((tiny_draft / "config.json").read_text())
    assert config["quantization_config"]["exclude"] == ["re:.*fc.*", "re:.*lm_head.*"]
    before = tree_digest(tiny_draft)
    again = runner.invoke(main, ["fix-config", str(tiny_draft)])
    assert "already correct, unchanged" in again.output
    assert tree_digest(tiny_draft) == before
    after = runner.invoke(main, ["inspect", str(tiny_draft), "--json"])
    problems = json.loads(after.output)["problems"]
    assert not any("exclude entry" in p for p in problems)


def test_fix_config_into_output_leaves_input_alone(tiny_draft: Path, tmp_path: Path) -> None:
    _fp8_config(tiny_draft, ["fc", "lm_head"])
    before = tree_digest(tiny_draft)
    out = tmp_path / "fixed"
    result = CliRunner().invoke(main, ["fix-config", str(tiny_draft), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert tree_digest(tiny_draft) == before
    copy = tree_digest(out)
    assert copy["model.safetensors"] == before["model.safetensors"]
    assert copy["config.json"] != before["config.json"]


def test_fix_config_on_bf16_draft_is_bad_input(tiny_draft: Path) -> None:
    result = CliRunner().invoke(main, ["fix-config", str(tiny_draft)])
    assert result.exit_code == 2
    assert "no quantization_config" in result.output


def test_inspect_reads_headers_without_torch(tiny_draft: Path) -> None:
    code = (
        "import sys; from eaglequant.cli import main\n"
        f"try:\n    main(['inspect', {str(tiny_draft)!r}, '--json'])\nexcept SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules and 'safetensors' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_planning_with_a_calibration_target_imports_no_torch(
    pair: dict[str, Path], tmp_path: Path
) -> None:
    """The background copy starts right after planning: torch must not be imported before it."""
    args = ["export", str(pair["draft"]), str(tmp_path / "o"), "--dry-run"]
    args += ["--calib-target", str(pair["target"]), "--calib-data", str(pair["data"])]
    args += ["--calib-engine", "transformers"]
    code = (
        "import sys; from eaglequant.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_card_carries_the_source_license(tmp_path: Path) -> None:
    from eaglequant.hub.card import source_license

    (tmp_path / "README.md").write_text("---\nlicense: apache-2.0\ntags: [x]\n---\n# Draft\n")
    assert source_license(tmp_path) == "apache-2.0"
    (tmp_path / "README.md").write_text("# no front matter\n")
    assert source_license(tmp_path) is None


def test_validate_passes_its_parallelism_and_engine_args_to_check_6s_capture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engines that check 6 captures with are validate's own: TP size and engine args."""
    from eaglequant.validate import validation
    from eaglequant.validate.request import ValidateRequest

    seen = []

    def stop(request: ValidateRequest, **_: object) -> None:
        seen.append(request)
        raise SystemExit(3)

    monkeypatch.setattr(validation, "validate_draft", stop)
    args = ["validate", "--target", str(TOY / "target"), "--draft", str(TOY / "draft")]
    args += ["--baseline", str(TOY / "draft"), "--prompts", str(TOY / "prompts.jsonl")]
    args += [
        "--tensor-parallel-size",
        "2",
        "--engine-arg",
        "max_num_seqs=8",
        "--capture-engine",
        "vllm",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3 and len(seen) == 1, result.output
    capture, engine = seen[0].capture, seen[0].engine
    assert capture.name == "vllm" and capture.options.tensor_parallel_size == 2
    assert dict(capture.options.engine_args) == dict(engine.engine_args) == {"max_num_seqs": 8}


def test_the_tie_options_default_to_the_checks_own_defaults() -> None:
    """The CLI does not import the check (it loads lightly), so the two must agree."""
    from eaglequant.cli.options import tie_margin_option
    from eaglequant.validate.lossless import DEFAULT_TIE_MARGIN, DEFAULT_TIE_STEPS

    command = tie_margin_option(click.Command("x"))
    defaults = {p.name: p.default for p in command.params}
    assert defaults == {"tie_margin": DEFAULT_TIE_MARGIN, "tie_steps": DEFAULT_TIE_STEPS}
