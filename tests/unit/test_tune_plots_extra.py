"""tune's plots are the ``plots`` extra: without matplotlib the tables are written, and one
line names the extra."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from eaglequant.render.reports import PLOTS
from eaglequant.tune import report
from tests.conftest import TOY
from tests.support import tune_summary


def test_without_matplotlib_tune_writes_its_tables_and_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else found(name)
    )
    report.write_reports(tmp_path, tune_summary(TOY / "draft"))  # type: ignore[arg-type]
    assert (tmp_path / "results.json").is_file() and (tmp_path / "results.md").is_file()
    assert not any((tmp_path / name).exists() for name in PLOTS)
    assert capsys.readouterr().err.splitlines() == [report.PLOTS_SKIPPED]


def test_with_matplotlib_tune_draws_its_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report.write_reports(tmp_path, tune_summary(TOY / "draft"))  # type: ignore[arg-type]
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in PLOTS)
