"""Draft forms in one room: a made-up form, defined and registered in this module alone, is
recognised, refused, shaped, named in vLLM and kept BF16 where it says, through the same code
paths as the real forms."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eaglequant.forms import form_of, registered
from eaglequant.forms.base import DraftForm, register, unregister
from eaglequant.forms.llama import LLAMA
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.rules.draft import dims_from_config, form_exclude, structure_problems
from eaglequant.rules.exclusions import draft_linear_names
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.support import inspect_json


class WideForm(DraftForm):
    """A Llama layer whose vLLM drafter keeps down_proj BF16 and refuses a flag."""

    family = "Wide"
    architectures = ("Eagle3WideForCausalLM",)
    variants = ("norm_output",)
    kept_bf16 = ("midlayer.mlp.down_proj",)

    def config_problem(self, config: dict[str, Any]) -> tuple[str, str] | None:
        if config.get("wide_window"):
            return ("wide_window is set: the Wide drafter has no window", "drop wide_window")
        return None

    def vllm_linear_names(
        self, config: dict[str, Any], target_layers: int, layers: int
    ) -> dict[str, tuple[str, ...]]:
        names = super().vllm_linear_names(config, target_layers, layers)
        return {name.replace("model.", "wide."): parts for name, parts in names.items()}


@pytest.fixture
def wide() -> Iterator[DraftForm]:
    form = register(WideForm())
    try:
        yield form
    finally:
        unregister(form)


def _wide_draft(folder: Path, **extra: Any) -> Path:
    config = draft_config(**extra) | {"architectures": ["Eagle3WideForCausalLM"]}
    return write_random_draft(folder, config, seed=0)


def test_every_built_in_form_is_registered() -> None:
    assert {f.family for f in registered()} == {"Llama", "Qwen3", "MLA (DeepSeek-V2 attention)"}


def test_a_registered_form_is_recognised_shaped_and_named(wide: DraftForm, tmp_path: Path) -> None:
    folder = _wide_draft(tmp_path / "wide", norm_output=True)
    ckpt = read_checkpoint(folder)
    assert structure_problems(ckpt) == []
    assert form_of(ckpt.config) is wide
    dims = dims_from_config(ckpt.config)
    assert dims.form is wide
    assert "midlayer.mlp.down_proj" not in dims.linears  # kept BF16: never given to Quark
    assert form_exclude(("fc", "lm_head"), dims) == ("fc", "lm_head", "midlayer.mlp.down_proj")
    names = draft_linear_names(ckpt.config, 4)
    assert "wide.layers.4.self_attn.qkv_proj" in names and "model.fc" in names
    code, report = inspect_json(folder)
    assert code == 0, report
    assert report["form"] == "EAGLE-3 Wide (norm_output)"


def test_a_registered_forms_refusal_is_reported(wide: DraftForm, tmp_path: Path) -> None:
    ckpt = read_checkpoint(_wide_draft(tmp_path / "wide", wide_window=True))
    problems = structure_problems(ckpt)
    assert [p.message for p in problems] == ["wide_window is set: the Wide drafter has no window"]


def test_without_the_form_the_draft_is_not_recognised(tmp_path: Path) -> None:
    ckpt = read_checkpoint(_wide_draft(tmp_path / "wide"))
    assert form_of(ckpt.config) is None
    [problem] = structure_problems(ckpt)
    assert "is not an EAGLE-3 draft" in problem.message
    assert LLAMA in registered()
