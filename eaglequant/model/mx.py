"""OCP MX arithmetic in plain torch: E8M0 block scales, MXFP8/MXFP4 dequantization and QDQ.

A block is 32 consecutive elements along a tensor's last (input) dimension
sharing one E8M0 scale: a biased power-of-two exponent byte (value
``2 ** (e - 127)``; 255 is NaN). MXFP8 elements are FP8 E4M3; MXFP4 elements
are FP4 E2M1 packed two a byte, the first element in the low nibble (the layout
Quark writes and vLLM reads).
"""

from __future__ import annotations

import torch

from eaglequant.recipe import E8M0_BIAS, E8M0_NAN, MX_BLOCK

FP4_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
ELEMENT_MAX = {"mxfp8_e4m3": 448.0, "mxfp4": 6.0}


def block_scales(exponents: torch.Tensor) -> torch.Tensor:
    """E8M0 exponent bytes -> float32 scales (NaN where the byte is 255)."""
    e = exponents.view(torch.uint8).float()
    return torch.where(e == E8M0_NAN, torch.nan, torch.exp2(e - E8M0_BIAS))


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 bytes (..., K/2) -> float32 values (..., K)."""
    table = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32, device=packed.device)
    table = torch.cat([table, -table])
    as_int = packed.view(torch.uint8).to(torch.int64)
    pairs = torch.stack([table[as_int & 0xF], table[(as_int >> 4) & 0xF]], dim=-1)
    return pairs.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def element_values(weight: torch.Tensor, dtype: str) -> torch.Tensor:
    """The stored elements as float32, unscaled (MXFP4 unpacked)."""
    return unpack_fp4(weight) if dtype == "mxfp4" else weight.float()


def dequantize(weight: torch.Tensor, exponents: torch.Tensor, dtype: str) -> torch.Tensor:
    """An OCP MX weight (elements and E8M0 exponents) as float32."""
    values = element_values(weight, dtype)
    rows, cols = values.shape
    blocks = values.view(rows, cols // MX_BLOCK, MX_BLOCK)
    return (blocks * block_scales(exponents).unsqueeze(-1)).view(rows, cols)


def quantize_dequantize(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """``x`` rounded through OCP MX ``dtype`` per 32-element block of its last dimension.

    The block scale is the smallest power of two that brings the block's amax
    within the element range (vLLM's emulated MXFP8 rule, used for both dtypes).
    """
    shape = x.shape
    blocks = x.float().reshape(*shape[:-1], shape[-1] // MX_BLOCK, MX_BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    scale = torch.exp2(torch.ceil(torch.log2(amax / ELEMENT_MAX[dtype])).clamp(-127, 127))
    scaled = blocks / scale
    fp4 = dtype == "mxfp4"
    rounded = _round_to_fp4(scaled) if fp4 else scaled.to(torch.float8_e4m3fn).float()
    return (rounded * scale).reshape(shape)


def _round_to_fp4(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 value (saturating at 6)."""
    grid = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32, device=x.device)
    midpoints = (grid[1:] + grid[:-1]) / 2
    index = torch.bucketize(x.abs(), midpoints)
    return torch.sign(x) * grid[index]
