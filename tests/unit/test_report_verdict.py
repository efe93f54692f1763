"""The overall verdict: an undecided category check does not hold it back; a failed one does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglequant.results.validation_report import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    Check,
    CheckId,
    ValidationReport,
    read_report,
)


def _report(*checks: tuple[CheckId, str]) -> ValidationReport:
    return ValidationReport(
        target="t", draft="d", baseline="b", k=3, prompts=80, max_tokens=128, backend="cpu",
        plugin_active=True, engines={}, prompts_sha256="0" * 64,
        checks=[Check.judged(name, verdict, f"{verdict} detail") for name, verdict in checks],
    )  # fmt: skip


WHOLE, POSITION = CheckId.ACCEPTANCE, CheckId.PER_POSITION
BY_CATEGORY, POSITION_BY_CATEGORY = CheckId.ACCEPTANCE_BY_CATEGORY, CheckId.PER_POSITION_BY_CATEGORY


@pytest.mark.parametrize(
    ("checks", "verdict"),
    [
        ([(WHOLE, PASS), (BY_CATEGORY, INCONCLUSIVE)], PASS),
        ([(WHOLE, PASS), (POSITION_BY_CATEGORY, INCONCLUSIVE)], PASS),
        ([(WHOLE, PASS), (BY_CATEGORY, FAIL)], FAIL),
        ([(POSITION, INCONCLUSIVE), (BY_CATEGORY, PASS)], INCONCLUSIVE),
        ([(WHOLE, INCONCLUSIVE), (BY_CATEGORY, INCONCLUSIVE)], INCONCLUSIVE),
    ],
)
def test_only_the_whole_set_must_be_decided(
    checks: list[tuple[CheckId, str]], verdict: str
) -> None:
    report = _report(*checks)
    assert report.verdict == verdict and report.passed == (verdict == PASS)


def test_an_undecided_category_is_named_and_kept_in_its_row(tmp_path: Path) -> None:
    report = _report((CheckId.ACCEPTANCE, PASS), (CheckId.ACCEPTANCE_BY_CATEGORY, INCONCLUSIVE))
    assert report.undecided_categories == ["2 acceptance by category"]
    assert report.check(CheckId.ACCEPTANCE_BY_CATEGORY).verdict == INCONCLUSIVE  # type: ignore[union-attr]
    path = tmp_path / "validation.json"
    path.write_text(json.dumps(report.to_json()))
    data = json.loads(path.read_text())
    assert (data["passed"], data["verdict"]) == (True, PASS)
    assert read_report(path).verdict == PASS
