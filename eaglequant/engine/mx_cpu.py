"""OCP MXFP4 weight dequantization and input fake quantization in plain torch, for vLLM on CPU.

vLLM emulates OCP MXFP4 layers where the platform has no MX GEMMs: it
dequantizes the weight, fake-quantizes (quantizes and dequantizes) the input
for an MXFP4-input scheme, then runs a high-precision GEMM. Both steps call
Quark's ``quark.torch.kernel.mx.dq_mxfp4`` / ``qdq_mxfp4``, HIP/CUDA kernels
with no CPU implementation. These are their CPU equivalents.

The numbers are Quark's. A block is 32 consecutive elements along the last
dimension. ``quant_dequant_mxfp4`` gives, bit for bit, what Quark's own CPU
MXFP4 fake quantization gives (its OCP MXFP4 quantizer's default path and
``fake_quantize_mx``): the "even" E8M0 scale of Quark's ``even_round``,
``2 ** (floor(log2(amax')) - 2)`` within ``2 ** ±127`` where ``amax'`` is the
block's amax rounded half up to one mantissa bit; elements rounded to the
nearest E2M1 value, ties to even, saturating at ±6; every result that rounds
to zero a +0 (Quark's CUDA kernel keeps the sign); computed in float32 and
returned in the input's dtype. ``dequant_mxfp4`` reads the layout Quark
exports and vLLM loads (``eaglequant.model.mx``) and multiplies in float32:
exact for BF16 and float32 outputs, so equal to Quark's kernel, which
multiplies in the output dtype. A 255 scale byte (NaN in OCP MX) gives NaN.
"""

from __future__ import annotations

import torch

from eaglequant.model.mx import ELEMENT_MAX, block_scales, unpack_fp4
from eaglequant.recipe import MX_BLOCK

SCALE_CALCULATION_MODES = ("even",)
FP4_EMAX = 2  # unbiased exponent of E2M1's largest value, 6 = 1.5 * 2 ** 2
_ONE_MANTISSA_BIT_ROUNDING = 1 << 21  # float32 bit pattern: rounds the mantissa to one bit
_EXPONENT_BITS = 0x7F800000  # float32 bit pattern: the exponent field


def dequant_mxfp4(x: torch.Tensor, scale: torch.Tensor, float_dtype: torch.dtype) -> torch.Tensor:
    """Packed E2M1 bytes (..., K/2) and E8M0 scale bytes (..., K/32) -> ``float_dtype`` (..., K)."""
    values = unpack_fp4(x).unflatten(-1, (-1, MX_BLOCK))
    return (values * block_scales(scale).unsqueeze(-1)).flatten(-2).to(float_dtype)


def quant_dequant_mxfp4(x: torch.Tensor, scale_calculation_mode: str = "even") -> torch.Tensor:
    """``x`` rounded through MXFP4 per 32-element block of its last dimension, in ``x``'s dtype."""
    if scale_calculation_mode not in SCALE_CALCULATION_MODES:
        raise ValueError(
            f"MXFP4 fake quantization on CPU: scale_calculation_mode "
            f"{scale_calculation_mode!r} is not supported (only 'even')"
        )
    if x.shape[-1] % MX_BLOCK:
        raise ValueError(
            f"MXFP4 fake quantization: the last dimension ({x.shape[-1]}) "
            f"is not a multiple of {MX_BLOCK}"
        )
    blocks = x.float().unflatten(-1, (-1, MX_BLOCK))
    scale = even_scale(blocks.abs().amax(-1, keepdim=True))
    return (round_to_fp4(blocks / scale) * scale).flatten(-2).to(x.dtype)


def even_scale(amax: torch.Tensor) -> torch.Tensor:
    """Quark's "even" E8M0 block scale for FP4 from a float32 block amax (NaN stays NaN)."""
    rounded = (amax.view(torch.int32) + _ONE_MANTISSA_BIT_ROUNDING) & _EXPONENT_BITS
    # A power of two, 0 (zero or tiny amax: scale 2 ** -127) or inf (scale 2 ** 127).
    exponent = torch.log2(rounded.view(torch.float32)) - FP4_EMAX
    return torch.where(amax.isnan(), amax, torch.exp2(exponent.clamp(-127, 127)))


def round_to_fp4(y: torch.Tensor) -> torch.Tensor:
    """Round float32 to the nearest E2M1 value, ties to even, saturating at ±6.

    E2M1's spacing is 0.5 below 2, 1 up to 4 and 2 beyond, so rounding
    ``y / spacing`` to an integer (``torch.round``: ties to even) rounds ``y``
    to the nearest E2M1 value, a tie to the one with the even mantissa.
    Infinities and NaN pass through, and a zero is +0, as in Quark.
    """
    magnitude = y.abs()
    spacing = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    limit = ELEMENT_MAX["mxfp4"]
    rounded = (torch.round(y / spacing) * spacing).clamp(-limit, limit)
    rounded = torch.where(y.isinf(), y, rounded)
    return torch.where(rounded == 0, 0.0, rounded)
