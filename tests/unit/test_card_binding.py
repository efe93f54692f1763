"""The model card and validate's binding: exact bytes, no machine path, how it was made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.errors import InputError
from eaglequant.hub.card import card_record
from eaglequant.io.readback import sha256_file
from eaglequant.render.reports import PLOTS
from eaglequant.results.binding import Binding, binding, bound_files, folder_files
from eaglequant.results.provenance import command_string, machine_paths
from eaglequant.results.validation_report import ValidationReport
from eaglequant.tune.report import write_reports
from eaglequant.validate.request import ValidateRequest, check_inputs
from tests.conftest import TOY
from tests.exported import LOCAL_NAMES, Exported, flip_byte, make_exported
from tests.support import tune_summary

REPO_ID = "example/toy-eagle3-fp8"


@pytest.fixture
def exported(tmp_path: Path) -> Exported:
    return make_exported(tmp_path)


def card(exported: Exported, *extra: str) -> tuple[int, str]:
    args = ["card", str(exported.folder), "--base-model", "toy/target", "--repo-id", REPO_ID]
    result = CliRunner().invoke(main, [*args, "--validation", str(exported.validation), *extra])
    return result.exit_code, result.output


def test_card_names_no_machine_path(exported: Exported, tmp_path: Path) -> None:
    code, output = card(exported)
    assert code == 0, output
    text = (exported.folder / "README.md").read_text()
    for local in (str(tmp_path), str(tmp_path.resolve()), *LOCAL_NAMES, "VLLM_DIST_IDENT"):
        assert local not in text
    assert machine_paths(text) == []
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["base_model"] == "toy/target"
    assert '"model": "example/toy-eagle3-fp8"' in text and "vllm serve toy/target" in text
    assert "FP8 draft `example/toy-eagle3-fp8`, BF16 baseline `<BF16_DRAFT>`" in text
    assert "32 prompts x 48 tokens" in text


def test_card_has_environment_reproduce_and_files(exported: Exported) -> None:
    assert card(exported)[0] == 0
    text = (exported.folder / "README.md").read_text()
    report = json.loads(exported.validation.read_text())
    environment = text.split("## Environment")[1].split("##")[0]
    assert "recorded by `eaglequant validate`" in environment
    assert f"eaglequant {report['environment']['versions']['eaglequant']}" in environment
    assert f"CPU: {report['environment']['cpu']['model']}" in environment
    reproduce = text.split("## Reproduce")[1].split("##")[0]
    assert (
        "eaglequant export <BF16_DRAFT> <FP8_DRAFT> --calib-target <TARGET> "
        "--calib-data <CALIB_DATA> --calib-engine transformers" in reproduce
    )
    assert (
        "eaglequant validate --target <TARGET> --draft <FP8_DRAFT> --baseline <BF16_DRAFT>"
        in reproduce
    )
    assert "`<TARGET>`: the target model (`toy/target`)" in reproduce
    manifest = json.loads((exported.folder / "eaglequant.json").read_text())
    for name, digest in manifest["files"].items():
        size = (exported.folder / name).stat().st_size
        assert f"| `{name}` | {size} | `{digest}` |" in text


def test_a_flipped_byte_in_a_shard_makes_card_refuse(exported: Exported) -> None:
    shard = exported.shards()[0]
    flip_byte(exported.folder / shard)
    code, output = card(exported)
    assert code == 2
    assert output.splitlines()[-1].startswith(
        f"error: {exported.folder / shard}: sha256 differs from the manifest eaglequant.json"
    )
    assert not (exported.folder / "README.md").exists()


def test_card_refuses_a_report_made_for_other_bytes(exported: Exported) -> None:
    shard = exported.shards()[-1]
    report = json.loads(exported.validation.read_text())
    report["files"]["draft"]["files"][shard] = "0" * 64
    exported.validation.write_text(json.dumps(report))
    code, output = card(exported)
    assert code == 2
    assert output.splitlines()[-1] == (
        f"error: {exported.validation}: made for other bytes: {shard} differs from "
        f"{exported.folder / shard}; rerun eaglequant validate on {exported.folder}"
    )
    del report["files"]
    exported.validation.write_text(json.dumps(report))
    code, output = card(exported)
    assert code == 2 and "records no sha256 of the files it validated" in output


def test_card_refuses_a_machine_path_it_cannot_name(exported: Exported) -> None:
    report = json.loads(exported.validation.read_text())
    report["checks"][0]["detail"] = "diverged; see /var/tmp/somewhere-else/engine.log"
    exported.validation.write_text(json.dumps(report))
    code, output = card(exported)
    assert code == 2
    assert "the card would name the machine path '/var/tmp/somewhere-else/engine.log'" in output


def test_without_a_report_the_card_says_whose_environment(exported: Exported) -> None:
    args = ["card", str(exported.folder), "--base-model", "toy/target", "--repo-id", REPO_ID]
    assert CliRunner().invoke(main, args).exit_code == 0
    text = (exported.folder / "README.md").read_text()
    assert "of the machine that rendered this card (no report recorded one)" in text
    assert "# validate: " not in text and "eaglequant export <BF16_DRAFT>" in text


def test_binding_hashes_the_manifest_files_and_verifies_them(exported: Exported) -> None:
    manifest = json.loads((exported.folder / "eaglequant.json").read_text())
    assert bound_files(exported.folder) == manifest["files"]
    assert "validation.json" not in manifest["files"]  # written later, not part of the export
    block = binding(exported.source)
    assert block == Binding(name="bf16-src-local", files=folder_files(exported.source))
    assert set(block.files) == {"config.json", "model.safetensors"}
    shard = exported.shards()[1]
    flip_byte(exported.folder / shard, 100)
    with pytest.raises(InputError, match=rf"{shard}: sha256 differs from the manifest"):
        bound_files(exported.folder)


def test_validate_refuses_changed_bytes_before_any_engine(tmp_path: Path) -> None:
    exported = make_exported(tmp_path)
    shard = exported.shards()[0]
    flip_byte(exported.folder / shard)
    request = ValidateRequest(
        target=TOY / "target", draft=exported.folder, baseline=TOY / "draft", prompts=["hi"]
    )
    with pytest.raises(InputError, match=rf"^{exported.folder / shard}: sha256 differs"):
        check_inputs(request)


def test_command_string_replaces_every_path(tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    argv = ["export", str(draft) + "/", f"--calib-data={tmp_path / 'd.jsonl'}", "--recipe"]
    argv += ["fp8-static", "--engine-arg", f"download_dir={tmp_path}/cache", "--note", "a b"]
    line = command_string(argv, {draft: "<BF16_DRAFT>", tmp_path / "d.jsonl": "<CALIB_DATA>"})
    assert line == (
        "eaglequant export <BF16_DRAFT> --calib-data=<CALIB_DATA> --recipe fp8-static "
        "--engine-arg 'download_dir=<PATH>' --note 'a b'"
    )


def test_card_embeds_recorded_tune_results_without_their_paths(
    exported: Exported, tmp_path: Path
) -> None:
    tune_dir = tmp_path / "tune-local"
    summary = tune_summary(exported.folder)
    tune_dir.mkdir()
    write_reports(tune_dir, summary)
    assert summary["target"].startswith("/")  # recorded on this machine, absolute
    code, output = card(exported, "--tune", str(tune_dir))
    assert code == 0, output
    text = (exported.folder / "README.md").read_text()
    assert machine_paths(text) == [] and str(Path(summary["target"]).parent) not in text
    assert "## Tuning (`eaglequant tune`)" in text and "| concurrency |" in text
    assert "# tune: the command line was not recorded" in text
    for name in PLOTS:
        assert (exported.folder / name).is_file() and f"]({name})" in text


def test_card_names_prompt_and_calibration_files_not_where_they_lie(
    exported: Exported, tmp_path: Path
) -> None:
    report = json.loads(exported.validation.read_text())
    prompts, calib = tmp_path / "sets" / "my-prompts.jsonl", tmp_path / "data" / "calib.jsonl"
    report["prompt_set"] = {"source": str(prompts), "sha256": "ab" * 32, "prompts": 32}
    report["calibration_overlap"] = {"shared": 0, "prompts": 32, "calibration": str(calib)}
    exported.validation.write_text(json.dumps(report))
    code, output = card(exported)
    assert code == 0, output
    text = (exported.folder / "README.md").read_text()
    assert f"Prompts: `my-prompts.jsonl` (sha256 `{'ab' * 32}`)" in text
    assert "calibration texts (`calib.jsonl`)" in text
    assert str(tmp_path) not in text and machine_paths(text) == []


def test_a_comparison_that_chose_the_baseline_says_so_in_the_usage_note() -> None:
    from eaglequant.hub.card import _usage

    tuning = {
        "kind": "comparison",
        "recommendation": {"text": "ship the BF16 draft", "by_concurrency": {}, "k": 0},
    }
    report = ValidationReport(
        target="t", draft="d", baseline="b", k=3, prompts=1, max_tokens=8, backend="cpu",
        plugin_active=False, engines={}, checks=[], prompts_sha256="",
    )  # fmt: skip
    config, note = _usage(REPO_ID, report, tuning)
    assert config["num_speculative_tokens"] == 3
    assert "this draft was not chosen at any concurrency (ship the BF16 draft)" in note
    assert "no k was faster" not in note


def test_an_http_endpoint_is_not_a_machine_path() -> None:
    from eaglequant.results.provenance import machine_paths

    assert machine_paths("acceptance from the server's /metrics, data in /tmp/x") == ["/tmp/x"]


def test_a_prompts_file_given_to_a_command_is_a_placeholder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt-source option naming a file is a path like any other; a set name is kept."""
    import click

    from eaglequant.cli.options import PROMPTS, invocation

    @click.command("export")
    @click.option("--calib-data", type=PROMPTS)
    @click.option("--prompts", type=PROMPTS)
    def command(calib_data: object, prompts: object) -> None:
        click.echo(invocation())

    data = tmp_path / "calib.jsonl"
    data.write_text('{"prompt": "a"}\n')
    args = ["--calib-data", str(data), "--prompts", "mt-bench:8"]
    monkeypatch.setattr("sys.argv", ["eaglequant", "export", *args])
    result = CliRunner().invoke(command, args)
    assert result.output.strip() == (
        "eaglequant export --calib-data <CALIB_DATA> --prompts mt-bench:8"
    )


def test_card_refuses_a_comparison_of_another_schema(exported: Exported, tmp_path: Path) -> None:
    compare_dir = tmp_path / "compare"
    compare_dir.mkdir()
    (compare_dir / "compare.json").write_text(json.dumps({"schema_version": 1, "rows": []}))
    args = ["card", str(exported.folder), "--base-model", "toy/target", "--compare"]
    result = CliRunner().invoke(main, [*args, str(compare_dir)])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1].startswith(
        f"error: {compare_dir / 'compare.json'}: not an eaglequant comparison"
    )
    assert not (exported.folder / "README.md").exists()


def _second_set(exported: Exported, source: str) -> Path:
    """The exported folder's report as if validated on another prompt set, with check 2's
    interval recorded as validate records it."""
    report = json.loads(exported.validation.read_text())
    report["prompts_sha256"] = "f" * 64
    report["prompt_set"] = {"source": source, "sha256": "e" * 64, "prompts": 32}
    interval = {"point": 0.995, "low": 0.99, "high": 1.001, "prompts": 32}
    report["checks"][1]["numbers"] = {"ratio": 0.995, "interval": interval | {"resamples": 2000}}
    path = exported.folder.parent / f"validation-{source}.json"
    path.write_text(json.dumps(report))
    return path


def test_card_tabulates_one_row_per_validated_prompt_set(exported: Exported) -> None:
    second = _second_set(exported, "humaneval")
    code, output = card(exported, "--validation", str(second))
    assert code == 0, output
    text = (exported.folder / "README.md").read_text()
    table = text.split("Each prompt set's run, in detail below.")[1].split("###")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert rows[0].startswith("| `-` | 32 | 3.214 / 3.190 | - PASS |")
    assert rows[1] == (
        "| `humaneval` | 32 | 3.214 / 3.190 | 0.995 [0.990, 1.001] PASS | - | none | PASS |"
    )
    assert text.count("### On `") == 2 and "### On `humaneval`" in text
    record = card_record(text)
    assert record is not None
    assert record["validations_sha256"] == [sha256_file(exported.validation), sha256_file(second)]
    publish = ["publish", str(exported.folder), "--repo-id", REPO_ID, "--dry-run"]
    for report in (exported.validation, second):
        result = CliRunner().invoke(main, [*publish, "--validation", str(report)])
        assert result.exit_code == 0, result.output


def test_card_refuses_two_reports_on_the_same_prompts(exported: Exported) -> None:
    same = exported.folder.parent / "again.json"
    same.write_text(exported.validation.read_text())
    code, output = card(exported, "--validation", str(same))
    assert code == 2
    assert output.splitlines()[-1] == (
        f"error: {same}: validated the same prompts as {exported.validation}; "
        "give one report per prompt set"
    )
    assert not (exported.folder / "README.md").exists()
