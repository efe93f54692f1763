"""JUnit XML for validation reports (``validate --junit-xml``), as CI systems read it.

The layout is the one pytest's own ``--junit-xml`` writes: ``testsuites`` >
``testsuite`` (tests, failures, errors, skipped, time) > ``testcase`` (classname,
name, time) > ``failure`` (message, the text). One suite per validated
draft, one test case per check; FAIL and INCONCLUSIVE are failures carrying
the check's detail.
"""

from __future__ import annotations

import platform
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import PurePath

from eaglequant.results.validation_report import PASS, ValidationReport

SUITE_PREFIX = "eaglequant.validate"


def junit_xml(reports: Sequence[ValidationReport]) -> str:
    """One ``testsuite`` per report (its draft folder's name), one ``testcase`` per check."""
    root = ET.Element("testsuites", name="eaglequant validate")
    for report in reports:
        root.append(_suite(report))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _suite(report: ValidationReport) -> ET.Element:
    classname = f"{SUITE_PREFIX}.{PurePath(report.draft).name}"
    checks = report.checks
    failures = sum(c.verdict != PASS for c in checks)
    wall = sum(float(e.wall_s or 0) for e in report.engines.values())
    suite = ET.Element(
        "testsuite",
        name=classname,
        errors="0",
        failures=str(failures),
        skipped="0",
        tests=str(len(checks)),
        time=f"{wall:.3f}",
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        hostname=platform.node(),
    )
    for check in checks:
        case = ET.SubElement(suite, "testcase", classname=classname, name=check.name, time="0")
        if check.verdict != PASS:
            message = f"{check.verdict}: {check.detail}"
            failure = ET.SubElement(case, "failure", message=message)
            failure.text = check.detail
    return suite
