"""The CPU expand shim's replacement: the Triton kernel's semantics, in every dtype vLLM uses."""

from __future__ import annotations

import pytest
import torch

from eaglequant.engine.cpu_spec_decode import expand_kernel_impl, shim_fills_floats


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_each_request_value_fills_its_tokens_with_the_replacement(dtype: torch.dtype) -> None:
    values = torch.tensor([0, 7, 3], dtype=dtype)  # request 0 greedy (temperature 0 -> 1)
    output = torch.empty(6, dtype=dtype)
    expand_kernel_impl(output, values, torch.tensor([2, 5, 6], dtype=torch.int32), 0, 1)
    assert output.tolist() == [1, 1, 7, 7, 7, 3]


def test_float_values_are_kept_and_requests_without_tokens_skipped() -> None:
    output = torch.full((4,), -1.0)
    temperature = torch.tensor([0.7, 0.9, 1.3])
    expand_kernel_impl(output, temperature, torch.tensor([2, 2, 4]), 0, 1)
    assert output.tolist() == pytest.approx([0.7, 0.7, 1.3, 1.3])


def test_a_shim_that_fills_a_copy_is_told_from_one_that_fills_the_output() -> None:
    def into_a_copy(output, input_val, cu_num_tokens, replace_from, replace_to):  # type: ignore[no-untyped-def]
        expand_kernel_impl(output.to(torch.int64), input_val.to(torch.int64), cu_num_tokens, 0, 1)

    assert not shim_fills_floats(into_a_copy)
    assert shim_fills_floats(expand_kernel_impl)


def test_the_runners_rewind_takes_a_generator_back_to_its_mark() -> None:
    from eaglequant.engine.cpu_spec_decode import rewindable_generator

    plain = torch.Generator(device="cpu").manual_seed(7)
    replacement = rewindable_generator()
    replacement.set_state(plain.get_state())
    replacement.mark()
    dropped = torch.rand(4, generator=replacement)  # a token the runner drops
    assert replacement.set_offset(replacement.get_offset() - 4) is replacement
    assert torch.equal(torch.rand(4, generator=replacement), dropped)
    assert torch.equal(dropped, torch.rand(4, generator=plain))
    with pytest.raises(RuntimeError, match="does not use offset"):
        plain.set_offset(0)  # what vLLM's runner calls on a CPU generator
