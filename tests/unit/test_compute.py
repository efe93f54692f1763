"""The BF16 and float32 GEMM paths give the draft the same calibration statistics.

Both paths are forced on this machine (``EAGLEQUANT_GEMM``) over a tiny BF16
draft unrolled 3 steps on 1024 tokens, its midlayer held in float32 (as Quark
holds it while it observes the weights, and as validate loads it) and in BF16
(as Quark holds it during its forward passes where BF16 is native, and as the
export's reference for measuring). Tolerance: every midlayer input range (what
a static input scale is: amax / 448) within 2e-4 relative, a tenth of BF16's
half-spacing, and each step's top-1 agreement at least 0.998 (measured here:
equal ranges, agreement 1.0). Without the float32 path's rounding of its
outputs to BF16 the ranges move by ~1e-3 and agreement drops to ~0.99; the
test runs that mutant too and requires it to fail. The float32 path never
hands a BF16 tensor to ``F.linear`` (a mutant that calls BF16 GEMMs there
fails); the BF16 path makes exactly the expected number of BF16 calls, the
BF16 midlayer's included (a mutant computing it in float32 fails). Slow tests
run Quark's calibration on each path (BF16 passes only where native, float32
weights at ``freeze``, equal input scales) and export the tiny pair's draft on
each path, comparing the written input scales and the manifest's top-1 agreement.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.model import compute
from eaglequant.model.eagle3 import Eagle3Draft, UpcastLinear
from eaglequant.model.load import load_draft_module, load_reference_layer
from eaglequant.model.ranges import input_amax
from eaglequant.quantize.measure import SimulatedFp8Linear
from eaglequant.quantize.quark_backend import _native_while_calibrating
from eaglequant.rules.draft import FIRST_LAYER
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.support import RANGE_RTOL, STEPS, compute_batches

MIN_AGREEMENT = 0.998


MIDLAYERS = ("float32 midlayer", "bf16 midlayer")


@pytest.fixture(params=MIDLAYERS)
def bf16_draft(tmp_path: Path, request: pytest.FixtureRequest) -> Eagle3Draft:
    ckpt = read_checkpoint(write_random_draft(tmp_path / "d", draft_config()))
    model = load_draft_module(ckpt)
    if request.param == "bf16 midlayer":
        model.midlayer = load_reference_layer(ckpt, FIRST_LAYER)
    return model


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
    bf16_draft: Eagle3Draft,
    rounding: str,
    monkeypatch: pytest.MonkeyPatch,
    linear_dtypes: list[tuple[torch.dtype, torch.dtype]],
) -> None:
    batches = compute_batches(bf16_draft)
    monkeypatch.setenv(compute.GEMM_ENV, "bf16")
    native = _statistics(bf16_draft, batches)
    midlayer_in_bf16 = bf16_draft.midlayer.mlp.down_proj.weight.dtype == torch.bfloat16
    bf16_calls = linear_dtypes.count((torch.bfloat16, torch.bfloat16))
    # fc and lm_head: 7 calls a batch (2 passes); a BF16-held midlayer 7 linears x 3 steps x 2
    assert bf16_calls == (7 + (7 * STEPS * 2 if midlayer_in_bf16 else 0)) * len(batches)
    linear_dtypes.clear()
    monkeypatch.setenv(compute.GEMM_ENV, "float32")
    if rounding != "bf16":
        monkeypatch.setattr(compute, "round_as", lambda values, _dtype: values.float())
    upcast = _statistics(bf16_draft, batches)
    assert linear_dtypes and all(torch.bfloat16 not in call for call in linear_dtypes)
    assert {"bf16", "float32"} <= set(compute.paths_taken())
    assert _within_tolerance(upcast, native) == (rounding == "bf16")


@pytest.mark.parametrize("path", compute.GEMM_PATHS)
def test_linear_rounds_to_bf16_and_top1_is_its_first_argmax(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compute.GEMM_ENV, path)
    for blocks in ("UPCAST_ELEMENTS", "VIEW_ELEMENTS"):  # 3 rows a block: blocks meet ties
        monkeypatch.setattr(compute, blocks, 3 * 40)
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


@pytest.mark.parametrize("path", compute.GEMM_PATHS)
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_module_linear_takes_and_gives_bf16_values(
    path: str, weight_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As vLLM's BF16 linear: the module sees BF16 values and returns BF16 values, in float32.

    Float32 weights as Quark observes them; BF16 ones as the reference (``UpcastLinear``).
    """
    monkeypatch.setenv(compute.GEMM_ENV, path)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(30, 40, generator=generator).bfloat16()
    module: torch.nn.Module = UpcastLinear(weight)
    if weight_dtype == torch.float32:
        module = torch.nn.Linear(40, 30, bias=False)
        module.weight.data = weight.float()
    seen = []
    module.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    x = torch.randn(2, 5, 40, generator=generator)
    out = compute.module_linear(module, x, torch.bfloat16)
    runs_in_bf16 = weight_dtype == torch.bfloat16 and path == "bf16"
    assert seen[0].dtype == (torch.bfloat16 if runs_in_bf16 else torch.float32)
    assert torch.equal(seen[0].float(), x.bfloat16().float())
    assert out.dtype == torch.float32 and torch.equal(out, out.bfloat16().float())
    exact = torch.nn.functional.linear(x.bfloat16().double(), module.weight.double())
    torch.testing.assert_close(out.double(), exact, rtol=2**-8, atol=1e-6)


@pytest.mark.parametrize("path", compute.GEMM_PATHS)
def test_simulated_fp8_linear_rounds_its_product_then_scales(
    path: str,
    monkeypatch: pytest.MonkeyPatch,
    linear_dtypes: list[tuple[torch.dtype, torch.dtype]],
) -> None:
    """FP8 inputs x FP8 weights (exact products), the sum rounded to BF16, then both scales."""
    monkeypatch.setenv(compute.GEMM_ENV, path)
    generator = torch.Generator().manual_seed(0)
    weight = (40 * torch.randn(24, 32, generator=generator)).to(torch.float8_e4m3fn)
    weight_scale = torch.rand(24, 1, generator=generator) + 0.5
    x = torch.randn(3, 5, 32, generator=generator)
    layer = SimulatedFp8Linear(weight, weight_scale, torch.tensor(0.01), per_token=False)
    # converted once where the GEMM runs in BF16 (exactly), kept FP8 where it runs in float32
    assert layer.weight.dtype == (torch.bfloat16 if path == "bf16" else torch.float8_e4m3fn)
    assert torch.equal(layer.weight.float(), weight.float())
    out = compute.module_linear(layer, x, torch.bfloat16)
    values = (x.bfloat16().float() / 0.01).clamp(-448, 448).to(torch.float8_e4m3fn)
    product = torch.nn.functional.linear(values.double(), weight.double())
    expected = (product.bfloat16().double() * 0.01 * weight_scale.double().flatten()).bfloat16()
    assert out.dtype == torch.float32
    assert ((torch.bfloat16, torch.bfloat16) in linear_dtypes) == (path == "bf16")
    mismatched = (out != expected.float()).float().mean()  # float32 sums flip a rare rounding
    assert mismatched <= 0.02
    torch.testing.assert_close(out, expected.float(), rtol=2**-7, atol=0)


def test_unknown_path_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compute.GEMM_ENV, "fp16")
    with pytest.raises(InputError, match="EAGLEQUANT_GEMM='fp16': use auto, bf16 or float32"):
        compute.cpu_gemm_path()


@pytest.mark.parametrize("weights", ["from BF16", "not BF16 values"])
def test_calibration_holds_bf16_weights_only_when_exact(
    weights: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BF16 midlayer weights during Quark's passes only where that loses nothing; float32 after."""
    monkeypatch.setenv(compute.GEMM_ENV, "bf16")
    model = load_draft_module(read_checkpoint(write_random_draft(tmp_path / "d", draft_config())))
    down = model.midlayer.mlp.down_proj
    if weights == "not BF16 values":
        down.weight.data[0, 0] += down.weight.data[0, 0].abs() * 2**-12
    before = down.weight.detach().clone()
    seen: list[torch.dtype] = []
    batch = compute_batches(model)[0]
    with _native_while_calibrating(model):
        model.register_forward_pre_hook(lambda *_: seen.append(down.weight.dtype))
        model(batch["aux_hidden"], batch["next_ids"])
    assert seen == [torch.bfloat16 if weights == "from BF16" else torch.float32]
    assert down.weight.dtype == torch.float32 and torch.equal(down.weight, before)
