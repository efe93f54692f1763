"""validate --against: the report reader and the regression gate on recorded per-prompt counts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from eaglequant.errors import InputError
from eaglequant.results.validation_report import (
    SCHEMA_VERSION,
    Check,
    CheckId,
    EngineSummary,
    ValidationReport,
    prompts_digest,
    read_report,
)
from eaglequant.validate.regression import (
    RunCounts,
    check_comparable,
    read_previous,
    regression_check,
)
from tests.unit import recorded_counts as recorded

PROMPTS = [f"prompt {i}" for i in range(32)]
OUTPUTS = "ab" * 32  # the target's tokens: every lossless draft generates them


def report(
    rows: list[tuple[tuple[int, ...], int]], prompts: list[str] = PROMPTS, **fp8: Any
) -> dict[str, Any]:
    """A validation report as ``validate --json`` writes it, its FP8 run holding ``rows``."""
    engine = EngineSummary(
        ok=True,
        returncode=0,
        timed_out=False,
        wall_s=1.0,
        outputs_sha256=OUTPUTS,
        per_prompt=[{"histogram": list(h), "num_draft_tokens": n} for h, n in rows],
    )
    made = ValidationReport(
        target="t",
        draft="out/draft-fp8",
        baseline="b",
        k=3,
        prompts=len(prompts),
        max_tokens=48,
        backend="cpu",
        plugin_active=True,
        engines={"fp8": replace(engine, **fp8)},
        checks=[Check(CheckId.ACCEPTANCE, True, "")],
        prompts_sha256=prompts_digest(prompts),
    )
    return made.to_json()


def previous(tmp_path: Path, data: dict[str, Any]) -> RunCounts:
    path = tmp_path / "previous.json"
    path.write_text(json.dumps(data))
    return read_previous(path)


def current(rows: list[tuple[tuple[int, ...], int]], prompts: list[str] = PROMPTS) -> RunCounts:
    from eaglequant.validate.regression import run_counts

    return run_counts(ValidationReport.from_json(report(rows, prompts)), "this run")


def test_the_same_counts_and_tokens_are_identical(tmp_path: Path) -> None:
    check = regression_check(
        current(recorded.FP8), previous(tmp_path, report(recorded.FP8)), max_regression=0.02
    )
    assert check.passed and check.numbers["identical"]
    assert check.detail == (
        f"identical to {tmp_path / 'previous.json'}: the same generated tokens (outputs_sha256 "
        "abababababab…) and the same acceptance on every prompt"
    )


def test_equal_tokens_with_other_counts_are_compared_not_identical(tmp_path: Path) -> None:
    """Speculative decoding is lossless: any draft generates the target's tokens."""
    check = regression_check(
        current(recorded.FP8), previous(tmp_path, report(recorded.BF16)), max_regression=0.02
    )
    assert check.passed and not check.numbers["identical"] and check.numbers["paired"]
    assert check.detail.startswith(
        f"no drop beyond noise vs {tmp_path / 'previous.json'}: mean acceptance length "
        "3.190 vs 3.214 (-0.024), ratio 0.992 [0.982, 1.002]; "
    )
    assert "position 3 0.635 vs 0.645 (-0.010), ratio 0.984 [0.964, 1.000] (within noise); " in (
        check.detail
    )
    assert check.detail.endswith(
        "tolerated drop 0.02 (ratio >= 0.980); paired bootstrap over the same 32 prompts "
        "(2000 resamples, seed 0, 95% interval)"
    )


def test_a_previous_report_with_higher_acceptance_fails_naming_the_position(
    tmp_path: Path,
) -> None:
    """With no tolerated drop, position 3's interval lies wholly below the previous run's."""
    check = regression_check(
        current(recorded.COARSE), previous(tmp_path, report(recorded.BF16)), max_regression=0.0
    )
    assert not check.passed and check.verdict == "FAIL"
    assert check.detail == (
        f"dropped beyond noise vs {tmp_path / 'previous.json'}: position 3 0.632 vs 0.645 "
        "(-0.013), ratio 0.980 [0.956, 0.998]; tolerated drop 0.0 (ratio >= 1.000); "
        "paired bootstrap over the same 32 prompts (2000 resamples, seed 0, 95% interval)"
    )


def test_a_collapsed_draft_fails_at_every_position(tmp_path: Path) -> None:
    check = regression_check(
        current(recorded.RANDOM), previous(tmp_path, report(recorded.FP8)), max_regression=0.02
    )
    assert not check.passed
    for label in ("mean acceptance length 1.000 vs 3.190", "position 1", "position 3"):
        assert label in check.detail


def test_other_prompts_fall_back_to_an_unpaired_bootstrap(tmp_path: Path) -> None:
    prompts = [f"other {i}" for i in range(16)]
    mine = current(recorded.COARSE[:16], prompts)
    check = regression_check(mine, previous(tmp_path, report(recorded.FP8)), max_regression=0.02)
    assert check.passed and not check.numbers["paired"]
    assert "(within noise)" in check.detail
    assert check.detail.endswith(
        f"prompt sets differ (prompts_sha256 {prompts_digest(prompts)[:12]}… x 48 tokens vs "
        f"{prompts_digest(PROMPTS)[:12]}… x 48 tokens): unpaired bootstrap, 16 and 32 prompts "
        "resampled independently (2000 resamples, seed 0, 95% interval)"
    )
    collapsed = current(recorded.RANDOM[:16], prompts)
    assert not regression_check(
        collapsed, previous(tmp_path, report(recorded.FP8)), max_regression=0.02
    ).passed


def test_another_k_is_refused(tmp_path: Path) -> None:
    earlier = previous(tmp_path, report(recorded.FP8))
    with pytest.raises(InputError) as caught:
        check_comparable(earlier, 4)
    assert str(caught.value) == (
        f"{tmp_path / 'previous.json'}: made with k=3, this run uses k=4; compare runs of the "
        "same k (pass --k 3)"
    )


def _refused(tmp_path: Path, data: Any) -> str:
    path = tmp_path / "report.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(InputError) as caught:
        read_report(path)
    return str(caught.value).removeprefix(f"{path}: ")


def test_the_reader_refuses_what_is_not_a_current_report(tmp_path: Path) -> None:
    assert _refused(tmp_path, "{").startswith("cannot read the validation report (")
    assert _refused(tmp_path, [1]) == "the validation report must be a JSON object"
    assert _refused(tmp_path, {"format": "x", "schema_version": 1}) == (
        "not an eaglequant validation report (kind None); pass a file written by eaglequant "
        "validate --json"
    )
    older = {key: value for key, value in report(recorded.FP8).items() if key != "kind"}
    assert _refused(tmp_path, older | {"schema_version": None}) == (
        "a validation report from an older eaglequant (no schema_version); run eaglequant "
        "validate --json again to write a current one"
    )
    newer = report(recorded.FP8) | {"schema_version": SCHEMA_VERSION + 1}
    assert _refused(tmp_path, newer) == (
        f"validation report schema_version {SCHEMA_VERSION + 1}, this eaglequant reads "
        f"{SCHEMA_VERSION}; run eaglequant validate --json again with this version"
    )
    cut = {key: value for key, value in report(recorded.FP8).items() if key != "engines"}
    assert _refused(tmp_path, cut) == (
        "validation report without ['engines']; the file is incomplete"
    )


def test_a_report_whose_fp8_run_failed_has_nothing_to_compare(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="its FP8 engine run did not finish"):
        previous(tmp_path, report(recorded.FP8, ok=False))
    bad = report(recorded.FP8, per_prompt=[{"histogram": [1]}])
    with pytest.raises(InputError, match=r"engines.fp8.per_prompt is malformed \(KeyError"):
        previous(tmp_path, bad)


def test_the_written_report_carries_kind_version_verdict_and_prompts_hash() -> None:
    data = report(recorded.FP8)
    assert list(data)[:2] == ["kind", "schema_version"]
    assert data["kind"] == "eaglequant validation report"
    assert data["schema_version"] == SCHEMA_VERSION
    assert (data["passed"], data["verdict"]) == (True, "PASS")
    assert data["prompts_sha256"] == prompts_digest(PROMPTS) != prompts_digest(PROMPTS[::-1])
    assert data["checks"][0]["verdict"] == "PASS"


def test_a_report_reads_back_typed_and_a_changed_verdict_is_refused(tmp_path: Path) -> None:
    data = report(recorded.FP8)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    read = read_report(path)
    assert read.to_json() == data  # every field, the checks typed again (CheckId names)
    assert read.check(CheckId.ACCEPTANCE) is read.checks[0] and read.check(CheckId.LAYERS) is None
    failing = data | {"checks": [{**data["checks"][0], "passed": False, "verdict": "FAIL"}]}
    assert _refused(tmp_path, failing) == (
        "says passed=True, verdict 'PASS', but its checks give passed=False, FAIL; the file "
        "was changed after validate wrote it: run eaglequant validate --json again"
    )
    unknown = data | {"checks": [{**data["checks"][0], "name": "8 vibes"}]}
    assert _refused(tmp_path, unknown).startswith("not a complete validation report (")
