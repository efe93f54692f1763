"""eaglequant's compiled static FP8 linear (AVX512-BF16): its build, its checks, its numbers.

The checks run before any engine uses the kernel, so they are tested on mutants of the C
source: each one wrong in one place must be refused. Without AVX512-BF16 (an AVX2 EPYC, or
this CPU under ``tests/as_avx2``) the kernel is never built: that is tested everywhere.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import torch

from eaglequant.engine import cpu_fp8_native as native

pytestmark = pytest.mark.unit
HAS_BF16 = torch.cpu._is_avx512_bf16_supported()
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX512-BF16")
SHIPPED = resources.files("eaglequant.engine").joinpath(native.SOURCE).read_bytes()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLEQUANT_CACHE", str(tmp_path / "cache"))


def _load(source: bytes = SHIPPED) -> native.NativeKernel:
    return native.NativeKernel(native._open(native.build(source)))


@needs_bf16
def test_the_shipped_kernel_builds_once_and_passes_its_checks(tmp_path: Path) -> None:
    first = native.build()
    assert first.parent == tmp_path / "cache" / "kernels" and first.is_file()
    made = first.stat().st_mtime_ns
    assert native.build() == first and first.stat().st_mtime_ns == made  # built once
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no scratch left
    native.check(_load())


@needs_bf16
@pytest.mark.parametrize(
    ("wrong", "right", "refused"),
    [
        # ties rounded up instead of to even, in the input quantization
        ("_mm512_set1_epi32(0x7FFFF)", "_mm512_set1_epi32(0x80000)", "input quantization"),
        # E4M3 subnormals rounded to 2^-8 instead of 2^-9
        ("(9 << 4) | _MM_FROUND", "(8 << 4) | _MM_FROUND", "input quantization"),
        # the scales left out of the epilogue
        ("_mm512_mul_ps(sum[r][j], s)", "sum[r][j]", "linear differs"),
        # the row tail dropped
        ("case 1: tile(1,", "case 1: break; tile(1,", "linear differs"),
    ],
)
def test_a_kernel_wrong_in_one_place_is_refused(wrong: str, right: str, refused: str) -> None:
    assert SHIPPED.count(wrong.encode()) == 1, wrong
    mutant = _load(SHIPPED.replace(wrong.encode(), right.encode()))
    with pytest.raises(native.Unavailable, match=refused):
        native.check(mutant)


@needs_bf16
def test_a_draft_sized_linear_is_the_fp8_arithmetic() -> None:
    """64 rows x 576 -> 960 (SmolLM2's draft qkv): against the quantized values multiplied in
    float64, scaled and rounded once; only float32 summation separates them."""
    generator = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 576, generator=generator) * 4).bfloat16()
    weight = (torch.randn(960, 576, generator=generator) * 60).to(torch.float8_e4m3fn)
    input_scale = torch.tensor([0.021])
    for weight_scale in (torch.tensor([[0.013]]), torch.rand(1, 960, generator=generator) / 50):
        scale = input_scale.reshape(1, 1) * weight_scale
        out = torch.empty(64, 960, dtype=torch.bfloat16)
        _load().linear(weight.t(), scale, input_scale.reciprocal()).into(out, x)
        values = torch.mul(x, input_scale.reciprocal()).clamp(-448, 448).to(torch.float8_e4m3fn)
        exact = (values.double() @ weight.double().t()) * scale.double()
        assert (out != exact.bfloat16()).float().mean() <= 1e-3
        _, exponent = torch.frexp(exact)
        near = (out.double() - exact).abs() <= torch.ldexp(torch.ones_like(exact), exponent - 7)
        assert near.float().mean() >= 0.9999  # apart only where the sum cancels


def test_without_avx512_bf16_nothing_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    with pytest.raises(native.Unavailable, match="no AVX512-BF16"):
        native.build()


def test_without_a_compiler_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(native.Unavailable, match="no C compiler on PATH"):
        native.build()


def test_a_source_that_does_not_compile_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    with pytest.raises(native.Unavailable, match=f"could not build {native.SOURCE}: .*error"):
        native.build(SHIPPED + b"\nthis is not C;\n")


def test_a_library_that_does_not_load_is_unavailable_not_an_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.so"
    broken.write_bytes(b"not an ELF file")
    with pytest.raises(native.Unavailable, match="broken.so does not load"):
        native._open(broken)
