"""The BF16 and float32 GEMM paths give the draft the same calibration statistics.

Both paths are forced on this machine (``EAGLEQUANT_GEMM``) over a tiny BF16
draft unrolled 3 steps on 1024 tokens. Tolerance: every midlayer input range
(what a static input scale is: amax / 448) within 2e-4 relative, a tenth of
BF16's half-spacing, and each step's top-1 agreement at least 0.998 (measured
here: equal ranges, agreement 1.0). Without the float32 path's rounding of
its outputs to BF16 the ranges move by ~1e-3 and agreement drops to ~0.99;
the test runs that mutant too and requires it to fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglequant.devtools.synthetic import draft_config, write_random_draft
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.model import compute
from eaglequant.model.eagle3 import Eagle3Draft
from eaglequant.model.load import load_draft_module
from eaglequant.model.ranges import input_amax

RANGE_RTOL = 2e-4
MIN_AGREEMENT = 0.998
STEPS = 3


@pytest.fixture
def bf16_draft(tmp_path: Path) -> Eagle3Draft:
    return load_draft_module(read_checkpoint(write_random_draft(tmp_path / "d", draft_config())))


def _batches(model: Eagle3Draft) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    dims = model.dims
    return [
        {
            "aux_hidden": 2 * torch.randn(4, 64, dims.fc_in, generator=generator),
            "next_ids": torch.randint(0, dims.vocab, (4, 64), generator=generator),
        }
        for _ in range(4)
    ]


@torch.no_grad()
def _statistics(
    model: Eagle3Draft, batches: list[dict[str, torch.Tensor]]
) -> tuple[dict[str, float], torch.Tensor]:
    """Each midlayer input's range and every step's top-1 (steps, tokens)."""
    ranges = input_amax(model, batches, STEPS)
    top1 = []
    for batch in batches:
        steps = model.unroll(batch["aux_hidden"], batch["next_ids"], STEPS, keep_logits=False)
        top1.append(torch.stack([step.top1.flatten() for step in steps]))  # type: ignore[union-attr]
    return ranges, torch.cat(top1, 1)


def _within_tolerance(
    a: tuple[dict[str, float], torch.Tensor], b: tuple[dict[str, float], torch.Tensor]
) -> bool:
    ranges_close = all(abs(a[0][n] - b[0][n]) <= RANGE_RTOL * b[0][n] for n in b[0])
    agreement = (a[1] == b[1]).float().mean(1)
    return ranges_close and bool((agreement >= MIN_AGREEMENT).all())


@pytest.mark.parametrize("rounding", ["bf16", "mutant: float32 outputs not rounded"])
def test_both_paths_give_the_same_ranges_and_top1(
    bf16_draft: Eagle3Draft, rounding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = _batches(bf16_draft)
    monkeypatch.setenv(compute.GEMM_ENV, "bf16")
    native = _statistics(bf16_draft, batches)
    monkeypatch.setenv(compute.GEMM_ENV, "float32")
    if rounding != "bf16":
        monkeypatch.setattr(compute, "round_as", lambda values, _dtype: values.float())
    upcast = _statistics(bf16_draft, batches)
    assert {"bf16", "float32"} <= set(compute.paths_taken())
    assert _within_tolerance(upcast, native) == (rounding == "bf16")


@pytest.mark.parametrize("path", compute.GEMM_PATHS)
def test_linear_rounds_to_bf16_and_top1_is_its_first_argmax(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compute.GEMM_ENV, path)
    monkeypatch.setattr(compute, "UPCAST_ELEMENTS", 3 * 40)  # 3 rows a block: blocks meet ties
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 40, generator=generator)
    weight = torch.randn(50, 40, generator=generator).bfloat16()
    weight[7] = weight[30] = 8 * x[0, 0] / x[0, 0].norm()  # token 0's top-1, tied across blocks
    out = compute.linear(x, weight)
    assert out.dtype == torch.float32 and torch.equal(out, out.bfloat16().float())
    exact = torch.nn.functional.linear(x.bfloat16().double(), weight.double())
    assert torch.allclose(out.double(), exact, rtol=2**-8, atol=1e-5)
    top1 = compute.top1(x, weight)
    assert torch.equal(top1, out.argmax(-1)) and top1[0, 0] == 7


def test_upcast_linear_scales_rows_without_touching_the_weight() -> None:
    weight = torch.randn(10, 6)
    before = weight.clone()
    scale = torch.arange(1.0, 11.0).reshape(-1, 1)
    x = torch.randn(3, 6)
    out = compute.upcast_linear(x, weight, scale)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, before * scale))
    assert torch.equal(weight, before)


def test_unknown_path_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compute.GEMM_ENV, "fp16")
    with pytest.raises(InputError, match="EAGLEQUANT_GEMM='fp16': use auto, bf16 or float32"):
        compute.cpu_gemm_path()
