"""Which drafts may share one engine, and each run's spec-decode counters out of cumulative ones."""

from __future__ import annotations

from pathlib import Path

from eaglequant.devtools.synthetic import draft_config, write_random_draft
from eaglequant.validate.single_engine import metrics_delta, swap_refusal
from tests.conftest import edit_config


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
    before = {"num_drafts": 10, "num_accepted_tokens": 17, "accepted_per_pos": [8, 6, 3]}
    after = {"num_drafts": 25, "num_accepted_tokens": 40, "accepted_per_pos": [20, 13, 7]}
    assert metrics_delta(after, before) == {
        "num_drafts": 15,
        "num_accepted_tokens": 23,
        "accepted_per_pos": [12, 7, 4],
    }
    assert metrics_delta(after, {}) == after


def test_the_report_line_names_mode_loads_and_seconds() -> None:
    from eaglequant.render.terminal import engines_line

    report = {"engine_mode": "single", "target_loads": 3, "load_s": 41.26, "generate_s": 9.0}
    assert engines_line(report) == (
        "engines: single, target loaded 3x (41.3s loading in engines, 9.0s generating)"
    )
