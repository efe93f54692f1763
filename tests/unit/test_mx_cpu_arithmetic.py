"""The torch-native MXFP4 kernels vLLM's CPU emulation runs with: hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from eaglequant.engine.mx_cpu import dequant_mxfp4, quant_dequant_mxfp4

# E2M1 codes 0..15: sign bit 3, exponent bits 2-1, mantissa bit 0.
CODES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
CODES += [-v for v in CODES]


def padded(values: list[float], width: int = 32) -> torch.Tensor:
    return torch.tensor([values + [0.0] * (width - len(values))])


def test_dequant_reads_the_low_nibble_first_and_scales_by_two_to_the_e_minus_127() -> None:
    packed = torch.tensor([[(2 * i + 1) % 16 << 4 | (2 * i) % 16 for i in range(16)]] * 3)
    scale = torch.tensor([[127], [128], [0]], dtype=torch.uint8)
    out = dequant_mxfp4(packed.to(torch.uint8), scale, torch.float32)
    codes = torch.tensor(CODES * 2)
    assert torch.equal(out[0], codes)
    assert torch.equal(out[1], codes * 2)
    assert torch.equal(out[2], codes * 2.0**-127)


def test_dequant_returns_the_asked_dtype_per_32_element_block() -> None:
    packed = torch.full((2, 32), 0x72, dtype=torch.uint8)  # low nibble 1.0, high nibble 6.0
    scale = torch.tensor([[126, 130]] * 2, dtype=torch.uint8)
    out = dequant_mxfp4(packed, scale, torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 64)
    assert out[0, :4].tolist() == [0.5, 3.0, 0.5, 3.0]
    assert out[0, 32:36].tolist() == [8.0, 48.0, 8.0, 48.0]


def test_qdq_ties_go_to_the_even_e2m1_value_and_saturate_at_six() -> None:
    # amax 6.96 keeps the scale at 1 (its mantissa 1.74 rounds down to one bit).
    x = padded([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, 6.96, 6.5, 0.2, -4.9])
    expected = padded([6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0, 6.0, 6.0, 0.0, -4.0])
    assert torch.equal(quant_dequant_mxfp4(x), expected)


def test_qdq_scale_rounds_the_amax_up_from_one_point_seven_five() -> None:
    # amax 7 = 1.75 * 4 rounds to 8: scale 2, and 7 / 2 = 3.5 ties up to 4.
    x = padded([7.0, 1.0, 0.5, 0.4])
    assert torch.equal(quant_dequant_mxfp4(x), padded([8.0, 1.0, 0.0, 0.0]))
    y = padded([6.99, 1.0, 0.5, 0.4])  # scale 1
    assert torch.equal(quant_dequant_mxfp4(y), padded([6.0, 1.0, 0.5, 0.5]))


def test_qdq_blocks_are_independent_and_zeros_are_positive() -> None:
    x = torch.cat([padded([96.0, 40.0]), -torch.zeros(1, 32), padded([-0.1, 6.0])], dim=1)
    out = quant_dequant_mxfp4(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    assert out[0, :2].tolist() == [96.0, 32.0]  # scale 16: 40 / 16 = 2.5 ties to 2
    assert torch.equal(out[0, 32:64].view(torch.int16), torch.zeros(32, dtype=torch.int16))
    assert out[0, 64:66].tolist() == [0.0, 6.0] and out[0, 64].view(torch.int16) == 0


def test_qdq_refuses_other_scale_modes_and_partial_blocks() -> None:
    with pytest.raises(ValueError, match="scale_calculation_mode 'floor' is not supported"):
        quant_dequant_mxfp4(torch.ones(1, 32), "floor")
    with pytest.raises(ValueError, match=r"last dimension \(48\) is not a multiple of 32"):
        quant_dequant_mxfp4(torch.ones(2, 48))
