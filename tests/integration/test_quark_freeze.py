"""Quark's static flow freezes without fake-quantizing the weights first (``quantize=False``):
its export quantizes them from the float weights either way. Every recipe Quark's module
flow exports is written byte for byte as with ``freeze``'s default."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.model.load import load_draft_module
from eaglequant.quantize.quark_backend import quantize_static
from eaglequant.recipe import builtin_recipes, load_recipe
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.support import STEPS, compute_batches

MODULE_FLOW = [name for name in builtin_recipes() if not load_recipe(name).direct_flow]


def test_every_module_flow_recipe_is_covered() -> None:
    assert {"fp8-static", "fp8-static-kv", "mxfp4", "mxfp8"} <= set(MODULE_FLOW)


@pytest.mark.parametrize("name", MODULE_FLOW)
def test_export_equals_the_export_of_fake_quantized_weights(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quark.torch import ModelQuantizer

    freeze, asked = ModelQuantizer.freeze, []

    def quark_default(model: torch.nn.Module, quantize: bool | None = None) -> torch.nn.Module:
        asked.append(quantize)
        return freeze(model)

    recipe = load_recipe(name)
    ckpt = read_checkpoint(write_random_draft(tmp_path / "d", draft_config()))
    written = []
    for default in (False, True):
        if default:
            monkeypatch.setattr(ModelQuantizer, "freeze", staticmethod(quark_default))
        model = load_draft_module(ckpt)
        model.unroll_steps = STEPS
        batches = None if recipe.calibration.fixed else compute_batches(model)
        written.append(quantize_static(model, recipe, batches, tmp_path / str(default)).tensors)
    assert asked == [False]  # the flow asked for no fake quantization; the rerun overrode it
    ours, quarks = written
    assert ours.keys() == quarks.keys() and any(t.dtype.itemsize == 1 for t in ours.values())
    for tensor_name, tensor in ours.items():
        expected = quarks[tensor_name]
        assert tensor.dtype == expected.dtype and tensor.shape == expected.shape, tensor_name
        assert torch.equal(_bytes(tensor), _bytes(expected)), tensor_name


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)
