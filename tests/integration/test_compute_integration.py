"""Quark's calibration on both GEMM paths (BF16 where native, float32 elsewhere): BF16 passes
only where native, float32 weights at ``freeze``, equal input scales; and the tiny pair's
draft exported on each path, with equal written input scales and top-1 agreement. The
paths' arithmetic without Quark is tests/unit/test_compute.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.model import compute
from eaglequant.model.eagle3 import Eagle3Draft
from eaglequant.model.load import load_draft_module
from eaglequant.quantize.quark_backend import quantize_static
from eaglequant.recipe import load_recipe
from eaglequant.rules.draft import MIDLAYER_LINEARS
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.support import RANGE_RTOL, STEPS, compute_batches, run_capture, run_export


def test_exports_forced_to_either_path_agree(
    pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Input scales within RANGE_RTOL, top-1 agreement (384 held-out tokens) within 1/200."""
    capture = tmp_path / "capture"
    run_capture(pair, capture, "--draft", str(pair["draft"]), "--samples", "14", "--seq-len", "48")
    written = {}
    for path in compute.GEMM_PATHS:
        monkeypatch.setenv(compute.GEMM_ENV, path)
        out = tmp_path / path
        calibration = ["--calib-hidden-states", str(capture), "--calib-samples", "6"]
        run_export([str(pair["draft"]), str(out), *calibration])
        manifest = json.loads((out / "eaglequant.json").read_text())
        assert path in manifest["device"]["gemm"]
        with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
            scales = {n: float(handle.get_tensor(f"{n}.input_scale")) for n in MIDLAYER_LINEARS}
        written[path] = scales, manifest["top1_agreement_by_step"]
    (native_scales, native_top1), (upcast_scales, upcast_top1) = written.values()
    for name, scale in native_scales.items():
        assert abs(upcast_scales[name] - scale) <= RANGE_RTOL * scale, name
    assert all(abs(a - b) <= 1 / 200 for a, b in zip(native_top1, upcast_top1, strict=True))


def test_quark_calibrates_in_bf16_only_where_native_and_freezes_float32(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    linear_dtypes: list[tuple[torch.dtype, torch.dtype]],
) -> None:
    """Quark's forward passes: the midlayer in BF16 on the BF16 path, in float32 on the other;
    the weights are float32 again for ``freeze``, and the written input scales agree."""
    from quark.torch import ModelQuantizer

    frozen: list[torch.dtype] = []
    freeze = ModelQuantizer.freeze

    def freezing(model: Eagle3Draft, **options: bool) -> Eagle3Draft:
        frozen.extend(model.get_submodule(n).weight.dtype for n in MIDLAYER_LINEARS)
        return freeze(model, **options)

    monkeypatch.setattr(ModelQuantizer, "freeze", staticmethod(freezing))
    ckpt = read_checkpoint(write_random_draft(tmp_path / "d", draft_config()))
    scales, bf16_calls = {}, {}
    for path in compute.GEMM_PATHS:
        monkeypatch.setenv(compute.GEMM_ENV, path)
        model = load_draft_module(ckpt)
        model.unroll_steps = STEPS
        linear_dtypes.clear()
        result = quantize_static(model, load_recipe(), compute_batches(model), tmp_path / path)
        bf16_calls[path] = linear_dtypes.count((torch.bfloat16, torch.bfloat16))
        scales[path] = {n: float(result.tensors[f"{n}.input_scale"]) for n in MIDLAYER_LINEARS}
    # per batch and step: 7 midlayer linears, plus fc once and lm_head on the scored steps
    assert bf16_calls["bf16"] >= 7 * STEPS * 4 and bf16_calls["float32"] == 0
    assert frozen == [torch.float32] * 2 * len(MIDLAYER_LINEARS)
    for name, scale in scales["bf16"].items():
        assert abs(scales["float32"][name] - scale) <= RANGE_RTOL * scale, name
