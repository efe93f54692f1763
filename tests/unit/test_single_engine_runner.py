"""Which drafts may share one engine, and each run's spec-decode counters out of cumulative ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eaglequant.results.engine_result import EngineRun
from eaglequant.validate.engine_run import metrics_delta
from eaglequant.validate.single_engine import swap_refusal
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.conftest import edit_config
from tests.support import engine_result, finished_engine


def test_same_shape_drafts_share_an_engine(tmp_path: Path) -> None:
    first = write_random_draft(tmp_path / "a", draft_config(), seed=0)
    second = write_random_draft(tmp_path / "b", draft_config(), seed=1)
    assert swap_refusal([first, second, first]) is None


def test_a_draft_of_another_shape_is_refused_with_its_key(tmp_path: Path) -> None:
    first = write_random_draft(tmp_path / "a", draft_config(), seed=0)
    wider = write_random_draft(tmp_path / "b", draft_config(kv_heads=4), seed=0)
    assert swap_refusal([first, wider]) == f"{wider} differs from {first} in dimensions"


def test_another_architecture_is_refused(tmp_path: Path) -> None:
    first = write_random_draft(tmp_path / "a", draft_config(), seed=0)
    other = write_random_draft(tmp_path / "b", draft_config(), seed=0)
    edit_config(other, architectures=["Eagle3Qwen3ForCausalLM"])
    assert swap_refusal([first, other]) == f"{other} differs from {first} in architectures"


def test_another_draft_vocabulary_is_refused(tmp_path: Path) -> None:
    first = write_random_draft(tmp_path / "a", draft_config(), seed=0)
    other = write_random_draft(tmp_path / "b", draft_config(draft_vocab=64), seed=0)
    assert swap_refusal([first, other]) == f"{other} differs from {first} in dimensions"


def test_counters_are_taken_over_one_run() -> None:
    before = {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 17}
    before |= {"accepted_per_pos": [8, 6, 3], "prefix_cache_queries": 100}
    after = {"num_drafts": 25, "num_draft_tokens": 75, "num_accepted_tokens": 40}
    after |= {"accepted_per_pos": [20, 13, 7], "prefix_cache_queries": 260}
    assert metrics_delta(after, before) == {
        "num_drafts": 15,
        "num_draft_tokens": 45,
        "num_accepted_tokens": 23,
        "accepted_per_pos": [12, 7, 4],
        "prefix_cache_queries": 160,
    }
    assert metrics_delta(after, {}) == after
    # a target-alone engine counts no spec decode: none is invented
    assert metrics_delta({"prefix_cache_queries": 5}, {}) == {"prefix_cache_queries": 5}


def test_the_report_line_names_mode_loads_and_seconds() -> None:
    from eaglequant.render.terminal import engines_line
    from eaglequant.results.validation_report import ValidationReport

    report = ValidationReport(
        target="t", draft="d", baseline="b", k=3, prompts=1, max_tokens=8, backend="cpu",
        plugin_active=False, engines={}, checks=[], prompts_sha256="",
        engine_mode="single", target_loads=3, load_s=41.26, generate_s=9.0,
    )  # fmt: skip
    assert engines_line(report) == (
        "engines: single, target loaded 3x (41.3s loading in engines, 9.0s generating)"
    )


def test_an_engine_ending_during_a_draft_keeps_earlier_runs_and_reruns_later_drafts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared child dies in its second draft: the first draft's run stands, the second
    is that draft's failed engine (its log named), the third gets an engine of its own."""
    import json

    from eaglequant.engine import process
    from eaglequant.engine.config import EngineOptions
    from eaglequant.engine.process import ChildRun
    from eaglequant.prompts.chat import RenderedPrompts
    from eaglequant.validate import single_engine
    from eaglequant.validate.request import ValidateRequest

    drafts = [write_random_draft(tmp_path / n, draft_config(), seed=0) for n in "abc"]
    first = engine_result({"num_drafts": 4}, None)

    def dies_in_the_second_draft(argv: list[str], log: Path, env: object, timeout: float) -> Any:
        spec = json.loads(Path(argv[-2]).read_text())
        partial = {"schema_version": first["schema_version"], "runs": [first], "refused": None}
        Path(spec[single_engine.PARTIAL_KEY]).write_text(json.dumps(partial))
        log.write_text("RuntimeError: qdq_mxfp4 is only implemented in CUDA devices\n")
        return ChildRun(returncode=1, timed_out=False, wall_s=3.0)

    monkeypatch.setattr(process, "run_child", dies_in_the_second_draft)  # under the helper
    request = ValidateRequest(
        target=tmp_path, draft=drafts[2], baseline=drafts[0], prompts=["p"],
        engine=EngineOptions(),
    )  # fmt: skip
    alone = finished_engine(engine_result({}, None))
    own: list[Path | None] = []

    def run_one(draft: Path | None, control: object) -> EngineRun:
        own.append(draft)
        return alone

    roles = [("target", None), ("bf16", drafts[0]), ("mx", drafts[1]), ("fp8", drafts[2])]
    rendered = RenderedPrompts(texts=["p"], chat_template=False)
    runs = single_engine.run_single(request, rendered, roles, run_one, lambda _m: None)
    assert runs.engines["bf16"]["ok"] and runs.engines["bf16"].get("result") == first
    mx = runs.engines["mx"]
    assert not mx["ok"] and "refused" not in mx and "qdq_mxfp4" in mx["log"]
    assert runs.engines["fp8"] is alone and own == [None, drafts[2]]
    assert runs.target_loads == 3
    assert runs.fallback == "the shared engine ended during mx"
