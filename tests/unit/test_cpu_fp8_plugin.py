"""The torch-native scaled_fp8_quant that the vLLM CPU plugin installs."""

from __future__ import annotations

import pytest
import torch

from eaglequant.engine.cpu_fp8_plugin import MIN_SCALE, torch_scaled_fp8_quant

FP8 = torch.float8_e4m3fn


def test_static_per_tensor_divides_clamps_and_casts() -> None:
    x = torch.tensor([[1.0, -2.0, 1000.0], [0.5, 0.0, -1000.0]])
    out, scale = torch_scaled_fp8_quant(x, torch.tensor([2.0]))
    assert out.dtype == FP8 and torch.equal(scale, torch.tensor([2.0]))
    expected = (x / 2).clamp(-448, 448).to(FP8)
    assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8))
    assert out.float()[0, 2] == 448 and out.float()[1, 2] == -448


def test_dynamic_per_tensor_scale_is_amax_over_448() -> None:
    x = torch.randn(4, 8) * 3
    out, scale = torch_scaled_fp8_quant(x)
    assert scale.shape == (1,)
    torch.testing.assert_close(scale, (x.abs().max() / 448).reshape(1))
    assert out.float().abs().max() == 448


def test_dynamic_per_token_has_one_scale_per_row() -> None:
    x = torch.randn(5, 16)
    x[2] = 0
    out, scale = torch_scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    assert scale.shape == (5, 1)
    torch.testing.assert_close(scale[0, 0], x[0].abs().max() / 448)
    assert scale[2, 0] == pytest.approx(MIN_SCALE)
    assert torch.equal(out[2].float(), torch.zeros(16))


def test_static_per_channel_and_per_token_group_shapes() -> None:
    x = torch.ones(2, 3)
    columns = torch.tensor([1.0, 2.0, 4.0])
    out, _ = torch_scaled_fp8_quant(x, columns, group_shape=(-1, 1))
    assert torch.equal(out.float(), torch.tensor([[1.0, 0.5, 0.25]] * 2))
    rows = torch.tensor([1.0, 4.0])
    out, _ = torch_scaled_fp8_quant(x, rows, group_shape=(1, -1))
    assert torch.equal(out.float(), torch.tensor([[1.0] * 3, [0.25] * 3]))


def test_padding_and_output_buffer() -> None:
    x = torch.ones(2, 4)
    out, _ = torch_scaled_fp8_quant(x, torch.tensor(1.0), num_token_padding=5)
    assert out.shape == (5, 4) and out.float()[2:].abs().sum() == 0
    buffer = torch.empty(2, 4, dtype=FP8)
    result, _ = torch_scaled_fp8_quant(x, torch.tensor(0.5), output=buffer)
    assert result is buffer and torch.equal(buffer.float(), torch.full((2, 4), 2.0))
