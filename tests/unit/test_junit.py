"""validate --junit-xml: read back with a JUnit reader and held to the layout pytest writes."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import junitparser
import pytest

from eaglequant.errors import OutputError
from eaglequant.io.output import check_file_output, write_text_atomic
from eaglequant.render.junit import junit_xml
from eaglequant.results.validation_report import Check, CheckId, EngineSummary, ValidationReport

NAMES = (CheckId.LOSSLESS, CheckId.ACCEPTANCE, CheckId.LAYERS, CheckId.ENGINE_LOG)


def _report(draft: str, verdicts: list[str]) -> ValidationReport:
    checks = [
        Check(NAMES[i], v == "PASS", f"detail {i + 1}", verdict=v) for i, v in enumerate(verdicts)
    ]
    engines = {
        role: EngineSummary(ok=True, returncode=0, timed_out=False, wall_s=wall)
        for role, wall in (("target", 20.5), ("fp8", 30.25))
    }
    return ValidationReport(
        target="t", draft=draft, baseline="b", k=3, prompts=1, max_tokens=8, backend="cpu",
        plugin_active=False, engines=engines, checks=checks, prompts_sha256="",
    )  # fmt: skip


REPORTS = [
    _report("out/demo/draft-fp8", ["PASS", "INCONCLUSIVE", "PASS", "FAIL"]),
    _report("/models/ptpc", ["PASS", "PASS"]),
]


def test_one_suite_per_draft_one_case_per_check_failures_carry_the_detail(
    tmp_path: Path,
) -> None:
    path = tmp_path / "validation.xml"
    write_text_atomic(path, junit_xml(REPORTS))
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert [s.name for s in suites] == ["eaglequant.validate.draft-fp8", "eaglequant.validate.ptpc"]
    first, second = suites
    assert (first.tests, first.failures, first.errors, first.skipped) == (4, 2, 0, 0)
    assert first.time == pytest.approx(50.75)
    cases = list(first)
    assert [c.name for c in cases] == ["1 lossless", "2 acceptance", "3 layers", "4 engine log"]
    assert {c.classname for c in cases} == {"eaglequant.validate.draft-fp8"}
    assert [c.is_passed for c in cases] == [True, False, True, False]
    inconclusive, failed = cases[1].result[0], cases[3].result[0]
    assert isinstance(inconclusive, junitparser.Failure)
    assert (inconclusive.message, inconclusive.text) == ("INCONCLUSIVE: detail 2", "detail 2")
    assert (failed.message, failed.text) == ("FAIL: detail 4", "detail 4")
    assert (second.tests, second.failures) == (2, 0)


def test_the_layout_is_pytests_own(tmp_path: Path) -> None:
    """Every element and attribute written is one pytest's --junit-xml writes for the same."""
    (tmp_path / "test_sample.py").write_text(
        "def test_ok():\n    pass\n\ndef test_bad():\n    assert 0, 'detail'\n"
    )
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sample.py",
         "--junit-xml", "pytest.xml", "-o", "junit_family=xunit2"],
        cwd=tmp_path, capture_output=True, check=False, timeout=120,
    )  # fmt: skip
    theirs = _layout(ET.parse(tmp_path / "pytest.xml").getroot())
    ours = _layout(ET.fromstring(junit_xml(REPORTS)))
    assert set(ours) == set(theirs) == {"testsuites", "testsuite", "testcase", "failure"}
    for tag, attributes in ours.items():
        assert attributes <= theirs[tag], tag


def _layout(root: ET.Element) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for element in root.iter():
        found.setdefault(element.tag, set()).update(element.attrib)
    return found


def test_an_output_in_a_missing_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(OutputError) as caught:
        check_file_output(tmp_path / "nowhere" / "report.xml")
    assert str(caught.value) == (
        f"{tmp_path / 'nowhere'}: no such folder; create the parent folder first"
    )
    with pytest.raises(OutputError, match="is a folder; name a file to write"):
        check_file_output(tmp_path)


def test_a_rewrite_replaces_the_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "report.xml"
    write_text_atomic(path, "old " * 1000)
    write_text_atomic(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["report.xml"]
    assert path.stat().st_mode & 0o777 == 0o644
