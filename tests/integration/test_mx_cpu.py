"""The torch-native MXFP4 kernels against real Quark on CPU, and vLLM's MX ops running them."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from eaglequant.engine.mx_cpu import dequant_mxfp4, quant_dequant_mxfp4
from tests.conftest import PYTHON, run_child

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SHAPES = ((4, 64), (2, 3, 96), (1, 32))
TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]  # the E2M1 midpoints below 6
NATIVE_OPS = """
import json, sys
import torch
import torch.nn.functional as F
from torch.nn import Module, Parameter
from eaglequant.engine import cpu_fp8_plugin
from eaglequant.engine.mx_cpu import dequant_mxfp4, quant_dequant_mxfp4

cpu_fp8_plugin.register()
cpu_fp8_plugin.register()
from vllm.model_executor.kernels.linear import init_mxfp4_linear_kernel
from vllm.model_executor.layers.quantization.quark.schemes import QuarkW4A8_MXFP4_FP8
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    kFp8StaticTensorSym,
    kMxfp4Dynamic,
)

g = torch.Generator().manual_seed(0)
x = torch.randn(4, 64, generator=g).to(torch.bfloat16)
packed = torch.randint(0, 256, (8, 32), dtype=torch.uint8, generator=g)
scale = torch.randint(110, 140, (8, 2), dtype=torch.uint8, generator=g)
w = dequant_mxfp4(packed, scale, torch.bfloat16)
layer = Module()
layer.weight = Parameter(packed, requires_grad=False)
layer.weight_scale = Parameter(scale, requires_grad=False)
layer.input_scale = s = Parameter(torch.tensor(0.01), requires_grad=False)
mxfp4 = init_mxfp4_linear_kernel(kMxfp4Dynamic)
mxfp4.process_weights_after_loading(layer)
w4a8 = QuarkW4A8_MXFP4_FP8(kFp8StaticTensorSym)
x_fp8 = ((x / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype) * s).to(x.dtype)
try:
    torch.ops.vllm.quant_dequant_mxfp4(x, "floor")
    refused = ""
except ValueError as exc:
    refused = str(exc)
print(json.dumps({
    "dequant": torch.equal(torch.ops.vllm.dequant_mxfp4(packed, scale, torch.bfloat16), w),
    "qdq": torch.equal(torch.ops.vllm.quant_dequant_mxfp4(x), quant_dequant_mxfp4(x)),
    "mxfp4_linear": torch.equal(
        mxfp4.apply_weights(layer, x), F.linear(quant_dequant_mxfp4(x), w)
    ),
    "w4a8_linear": torch.equal(w4a8.apply_weights(layer, x), F.linear(x_fp8, w)),
    "refused": refused,
    "quark_kernels_imported": "quark.torch.kernel" in sys.modules,
}))
"""


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns, so that -0.0 differs from 0.0 and NaN equals NaN."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def edge_blocks() -> torch.Tensor:
    """Blocks of 32 whose amax is 6 * 2**k (scale 2**k): E2M1 ties, their neighbours, negatives;
    then saturation, zeros, float subnormals, the top of the E8M0 range, NaN and infinities."""
    ties = torch.tensor(TIES)
    near = torch.cat([ties, torch.nextafter(ties, ties * 0), torch.nextafter(ties, ties * 2)])
    base = torch.cat([torch.tensor([6.0, -6.0, 0.1, -0.1]), near, -ties])
    rows = [torch.ldexp(base, torch.tensor(k)) for k in (-133, -127, -126, -20, 0, 20, 126)]
    rows.append(torch.linspace(-6.96, 6.96, 32))  # amax below 7: scale 1, outer values saturate
    rows.append(torch.full((32,), 7.0))  # amax 1.75 * 4 rounds up: scale 2
    rows.append(torch.zeros(32))
    rows.append(-torch.zeros(32))
    rows.append(torch.full((32,), -3e-41))  # float32 subnormals
    rows.append(torch.full((32,), 1.75 * 2.0**127))  # the rounded amax overflows to inf
    special = torch.randn(32, generator=torch.Generator().manual_seed(3))
    special[[4, 7, 9]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    rows.append(special)
    return torch.stack(rows)


def inputs(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(shape))
    spread = torch.exp2(torch.randint(-12, 12, (*shape[:-1], 1), generator=g).float())
    return (torch.randn(shape, generator=g) * spread).to(dtype)


@pytest.fixture(scope="module")
def quark() -> dict[str, Any]:
    """Quark's own MXFP4 quantizers on CPU, for inputs (dynamic) and weights (static)."""
    from quark.torch.export.nn.modules.realquantizer import StaticScaledRealQuantizer
    from quark.torch.kernel.hw_emulation.hw_emulation_interface import fake_quantize_mx
    from quark.torch.quantization.config.config import OCP_MXFP4Spec
    from quark.torch.quantization.tensor_quantize import FakeQuantizeBase

    def spec(dynamic: bool) -> Any:
        return OCP_MXFP4Spec(ch_axis=-1, is_dynamic=dynamic).to_quantization_spec()

    def quantizer(dynamic: bool) -> Any:
        return FakeQuantizeBase.get_fake_quantize(spec(dynamic), device=torch.device("cpu"))

    def real_quantizer(fake: Any, dtype: torch.dtype) -> Any:
        cpu = torch.device("cpu")
        return StaticScaledRealQuantizer(spec(False), fake, False, True, dtype, cpu)

    return {"quantizer": quantizer, "real": real_quantizer, "fake_quantize_mx": fake_quantize_mx}


def quark_qdq(quark: dict[str, Any], x: torch.Tensor) -> list[torch.Tensor]:
    """Quark's input QDQ on CPU, twice: its MXFP4 input quantizer's default (non-fused) path,
    which bf16/fp16 inputs skip for the CUDA kernel, and its generic MX fake quantization."""
    mx = quark["fake_quantize_mx"](x, -1, 32, "even", mx_element_dtype="fp4")
    return [quark["quantizer"](True).fake_quantize(x), mx]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_qdq_equals_quarks_bit_for_bit(
    quark: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    x = inputs(shape, dtype)
    out = quant_dequant_mxfp4(x)
    assert out.dtype == dtype and out.shape == x.shape
    for reference in quark_qdq(quark, x):
        assert torch.equal(bits(out), bits(reference))


@pytest.mark.parametrize("dtype", DTYPES)
def test_qdq_equals_quarks_at_ties_saturation_zeros_and_subnormals(
    quark: dict[str, Any], dtype: torch.dtype
) -> None:
    x = edge_blocks().to(dtype)
    out = quant_dequant_mxfp4(x)
    for reference in quark_qdq(quark, x):
        assert torch.equal(bits(out), bits(reference))


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_quarks_export_dequantizes_to_the_fake_quantized_values(
    quark: dict[str, Any], dtype: torch.dtype
) -> None:
    """A weight packed and scaled by Quark's exporter (StaticScaledRealQuantizer: E2M1 codes two
    a byte, E8M0 scale bytes), read back by dequant_mxfp4: exactly Quark's fake quantization."""
    weight = inputs((16, 128), dtype)
    weight[3] = 0
    fake = quark["quantizer"](False)
    fake_quantized = fake(weight)
    exporter = quark["real"](fake, dtype)
    packed = exporter.to_real_quantize_params(weight)
    exporter.maybe_convert_and_transpose_scale()
    assert packed.dtype == torch.uint8 and packed.shape == (16, 64)
    assert exporter.scale.dtype == torch.uint8 and exporter.scale.shape == (16, 4)
    out = dequant_mxfp4(packed, exporter.scale, dtype)
    assert torch.equal(bits(out), bits(fake_quantized))
    assert torch.equal(bits(out), bits(quant_dequant_mxfp4(weight)))


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_dequant_equals_quarks_importer_on_every_byte_and_scale(
    quark: dict[str, Any], dtype: torch.dtype
) -> None:
    """Every packed byte under every finite E8M0 scale, against Quark's own unpack and dequant."""
    packed = torch.arange(256, dtype=torch.uint8).reshape(16, 16).repeat(255, 1)
    scale = torch.arange(255, dtype=torch.uint8).repeat_interleave(16).reshape(-1, 1)
    importer = quark["real"](None, dtype)
    importer.scale = scale
    reference = importer(packed).to(dtype)
    assert torch.equal(bits(dequant_mxfp4(packed, scale, dtype)), bits(reference))


def test_vllm_mx_ops_and_emulation_kernels_run_the_torch_kernels_on_cpu(tmp_path: Any) -> None:
    """After the plugin's register() (twice), vLLM's two ops, its MXFP4 emulation linear kernel
    and its W4A8 MXFP4/FP8 scheme compute with mx_cpu, without importing Quark's kernels."""
    out = json.loads(run_child([PYTHON, "-c", NATIVE_OPS], cwd=tmp_path).splitlines()[-1])
    refusal = "MXFP4 fake quantization on CPU: scale_calculation_mode 'floor' is not supported"
    assert out == {
        "dequant": True,
        "qdq": True,
        "mxfp4_linear": True,
        "w4a8_linear": True,
        "refused": refusal + " (only 'even')",
        "quark_kernels_imported": False,
    }
