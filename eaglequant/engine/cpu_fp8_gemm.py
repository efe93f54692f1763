"""vLLM's torch FP8 linears on a CPU as vLLM's own CPU GEMM over the FP8 values.

One patch of the CPU plugin (:mod:`eaglequant.engine.cpu_fp8_plugin`, which applies it
guarded, with the others). Why and how: :func:`plain_fp8_gemm`.
"""

from __future__ import annotations

import functools
import math
import os
import weakref
from typing import Any

from eaglequant.engine import cpu_fp8_native

GEMM_ENV = "EAGLEQUANT_CPU_FP8_GEMM"  # auto (default), native, float32 or bfloat16
MODES = ("auto", "native", "float32", "bfloat16")


def plain_fp8_gemm() -> None:
    """Run vLLM's torch FP8 linears on CPU as one CPU GEMM over the FP8 values.

    FP8 linears that no native CPU FP8 kernel takes (on an AVX2 EPYC or a Zen 4 all of
    them; with eaglequant's engines on AMX too, see ``engine.config``) reach
    ``PerTensorTorchFP8ScaledMMLinearKernel`` or ``ChannelWiseTorchFP8ScaledMMLinearKernel``,
    whose ``torch._scaled_mm`` takes tens of milliseconds a call on a CPU (and is refused
    by oneDNN limited to AVX2). Every E4M3 value, and every product of two, is exact in
    float32 and in BF16, so a GEMM over them with float32 accumulation and the scales
    applied after is the FP8 GEMM, to the summation order.

    - A BF16 input with one static scale and no bias (every static FP8 draft linear) is, on
      a CPU with AVX512-BF16, one call of eaglequant's compiled kernel
      (:mod:`eaglequant.engine.cpu_fp8_native`): quantized as vLLM quantizes it, multiplied
      in BF16 pairs into float32 sums, scaled and rounded to BF16 once, from a BF16-sized
      weight. Elsewhere (AVX2; no compiler) it is looked up in a per-layer table of vLLM's
      quantization and multiplied by vLLM's oneDNN GEMM with the scales folded into its
      float32 weight, writing BF16 itself (:func:`_scaled_gemm`).
    - Other inputs run vLLM's quantization and the GEMM vLLM picks for an unquantized CPU
      linear (``dispatch_cpu_unquantized_gemm``) in float32, the scales after.

    :data:`GEMM_ENV` chooses: ``auto`` (the default: the kernel where it loads),
    ``native`` (the kernel, or an error saying why not), ``float32`` (vLLM's GEMMs), or
    ``bfloat16`` (vLLM's GEMMs in BF16: the sums rounded to BF16 once before the scales,
    which moved the real pair's FP8 acceptance by 0.6%, ``docs/benchmarks.md``; for
    speed, not for a verdict). The layer keeps its FP8 weight (what check 3 reads); each
    path's copy is made when first needed and kept beside it. Idempotent.

    Served as vLLM serves by default, the model's forward is compiled (torch.compile), and
    none of this can be traced: the kernel is a ctypes call, the GEMMs are built on first use.
    So the path is chosen once per layer when vLLM processes the layer's weights (outside any
    compiled region: the kernel is built, loaded and checked there), and the whole linear is
    one opaque op, ``eaglequant::cpu_fp8_linear`` (:func:`cpu_fp8_linear`), that the compiled
    graph calls by the layer's name, as vLLM's own attention op is called.
    """
    # lazy: vllm is an optional extra
    from vllm.model_executor.kernels.linear.scaled_mm import pytorch

    for kernel in (
        pytorch.PerTensorTorchFP8ScaledMMLinearKernel,
        pytorch.ChannelWiseTorchFP8ScaledMMLinearKernel,
    ):
        if getattr(kernel.apply_weights, "plain_gemm", False):
            continue  # patched already (another patch may wrap apply_scaled_mm after this)
        _register_op()
        original_apply, original_process = (
            kernel.apply_weights,
            kernel.process_weights_after_loading,
        )

        def process_weights_after_loading(
            self: Any, layer: Any, _original: Any = original_process, _apply: Any = original_apply
        ) -> None:
            _original(self, layer)
            _prepare(self, layer, _apply)

        def apply_weights(
            self: Any, layer: Any, x: Any, bias: Any = None, _original: Any = original_apply
        ) -> Any:
            # lazy: torch-free core
            import torch

            name = getattr(layer, LAYER_NAME, None)
            if name is not None and isinstance(x, torch.Tensor):
                return torch.ops.eaglequant.cpu_fp8_linear(x, bias, name)
            return _linear(self, layer, x, bias, _original)  # a layer vLLM did not process

        apply_weights.plain_gemm = True  # type: ignore[attr-defined]
        kernel.apply_weights = apply_weights  # type: ignore[method-assign]
        kernel.process_weights_after_loading = process_weights_after_loading  # type: ignore[method-assign]
        kernel.apply_scaled_mm = plain_scaled_mm  # type: ignore[method-assign]


# The attribute that names a processed layer in :data:`_PREPARED`, and that registry: by
# layer name, what :func:`cpu_fp8_linear` runs (weakly held: a swapped-out draft is freed).
LAYER_NAME = "_eaglequant_cpu_fp8_linear"
_PREPARED: weakref.WeakValueDictionary[str, _Prepared] = weakref.WeakValueDictionary()


class _Prepared:
    """One processed layer's CPU FP8 linear: its kernel object, the layer, vLLM's own
    ``apply_weights`` (dynamic and per-token inputs), and the output's width and dtype (for
    the op's shape under tracing). Held by the layer itself; the registry refers to it."""

    def __init__(self, kernel: Any, layer: Any, apply: Any) -> None:
        weight = kernel._get_layer_params(layer)[0]
        self.outputs, self.out_dtype = int(weight.shape[1]), kernel.config.out_dtype
        self._kernel, self._layer, self._apply = weakref.ref(kernel), weakref.ref(layer), apply

    def __call__(self, x: Any, bias: Any) -> Any:
        kernel, layer = self._kernel(), self._layer()
        if kernel is None or layer is None:
            raise RuntimeError("eaglequant::cpu_fp8_linear: the layer was freed")
        return _linear(kernel, layer, x, bias, self._apply)


def _prepare(kernel: Any, layer: Any, apply: Any) -> None:
    """Choose the layer's path now, at weight processing (the static state, with the compiled
    kernel where it loads), and name the layer for :func:`cpu_fp8_linear`. The name is the
    layer's own vLLM prefix (a compiled graph cached on disk names it again in a later
    process), made unique where two live layers share one."""
    _static_state(kernel, layer)
    prepared = _Prepared(kernel, layer, apply)
    base = getattr(layer, "prefix", "") or "linear"
    name, number = base, 1
    while _PREPARED.get(name) not in (None, getattr(layer, "_eaglequant_prepared", None)):
        number += 1
        name = f"{base}#{number}"
    layer._eaglequant_prepared = prepared  # the layer keeps it alive, not the registry
    _PREPARED[name] = prepared
    setattr(layer, LAYER_NAME, name)


def _linear(kernel: Any, layer: Any, x: Any, bias: Any, apply: Any) -> Any:
    """The layer's output: the static-input path, else vLLM's own ``apply_weights`` (which
    quantizes the input and reaches :func:`plain_scaled_mm`)."""
    out = _static_input_linear(kernel, layer, x, bias)
    return apply(kernel, layer, x, bias) if out is None else out


def cpu_fp8_linear(x: Any, bias: Any, layer: str) -> Any:
    """``eaglequant::cpu_fp8_linear``: the named layer's FP8 linear of ``x``, run eagerly."""
    return _PREPARED[layer](x, bias)


def _cpu_fp8_linear_shape(x: Any, bias: Any, layer: str) -> Any:
    """The op's output under tracing: ``x``'s rows, the layer's width, its output dtype."""
    prepared = _PREPARED[layer]
    return x.new_empty((*x.shape[:-1], prepared.outputs), dtype=prepared.out_dtype or x.dtype)


_LIBRARY: list[Any] = []  # the torch.library fragment that holds the op (kept alive)


def _register_op() -> None:
    """Define ``eaglequant::cpu_fp8_linear`` once a process: a CPU kernel and a fake for
    tracing, registered directly as vLLM registers its own ops."""
    if _LIBRARY:
        return
    # lazy: torch-free core
    from torch.library import Library

    library = Library("eaglequant", "FRAGMENT")
    library.define("cpu_fp8_linear(Tensor x, Tensor? bias, str layer) -> Tensor")
    library.impl("cpu_fp8_linear", cpu_fp8_linear, "CPU")
    library._register_fake("cpu_fp8_linear", _cpu_fp8_linear_shape)
    _LIBRARY.append(library)


def gemm_mode() -> str:
    """What :data:`GEMM_ENV` asks for: one of :data:`MODES` (``auto`` when unset)."""
    chosen = os.environ.get(GEMM_ENV) or "auto"
    if chosen not in MODES:
        raise ValueError(f"{GEMM_ENV}={chosen!r}: use one of {', '.join(MODES)}")
    return chosen


def gemm_dtype() -> Any:
    """The dtype vLLM's GEMMs multiply the FP8 values in: BF16 where :data:`GEMM_ENV` says
    ``bfloat16``, else float32."""
    # lazy: torch-free core
    import torch

    return torch.bfloat16 if gemm_mode() == "bfloat16" else torch.float32


def _native_linear(weight: Any, scale: Any, inverse: Any) -> Any:
    """The compiled kernel's linear for this layer, or None where :data:`GEMM_ENV` or the
    CPU leaves vLLM's GEMMs (``native`` asked for and unavailable: an error naming why)."""
    mode = gemm_mode()
    if mode not in ("auto", "native"):
        return None
    loaded = cpu_fp8_native.kernel()
    if loaded is None and mode == "native":
        raise ValueError(f"{GEMM_ENV}=native: {cpu_fp8_native.unavailable()}")
    return None if loaded is None else loaded.linear(weight, scale, inverse)


def _static_input_linear(kernel: Any, layer: Any, x: Any, bias: Any) -> Any:
    """The layer's output for a BF16/float16/float32 input with one static input scale
    (None for any other case: vLLM's own path then quantizes, and :func:`plain_scaled_mm`
    multiplies)."""
    # lazy: torch-free core
    import torch

    state = _static_state(kernel, layer)
    if state is None or not isinstance(x, torch.Tensor) or x.dtype.itemsize < 2:
        return None  # no static scale, or inputs vLLM quantized already
    rows = x.reshape(-1, x.shape[-1])
    if state.native is not None and bias is None and x.dtype == torch.bfloat16:
        # One call: quantized, multiplied, scaled and rounded to BF16 in the kernel.
        result = torch.empty((*x.shape[:-1], state.outputs), dtype=x.dtype)
        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        state.native.into(result.view(-1, state.outputs), rows)
        return result
    values = state.quantize(rows)
    if state.scaled_into is not None and bias is None and x.dtype == torch.bfloat16:
        # One GEMM from the looked-up values to the BF16 output, the scales folded in.
        result = torch.empty((*x.shape[:-1], state.outputs), dtype=x.dtype)
        state.scaled_into(result.view(-1, state.outputs), values)
        return result
    out = state.linear(values)
    shape = (*x.shape[:-1], out.shape[-1])
    if bias is None and x.dtype != torch.float32:
        # The scales applied in float32 and the product cast to the input's dtype, in one pass
        # (a BF16 GEMM's output is promoted: the scale is a float32 tensor with a dimension).
        result = torch.empty(shape, dtype=x.dtype)
        torch.mul(out, state.scale, out=result.view(out.shape))
        return result
    out = out.mul_(state.scale) if out.dtype == torch.float32 else torch.mul(out, state.scale)
    if bias is not None:
        out.add_(bias)
    return out.to(x.dtype).view(shape)


class _StaticInput:
    """What the static-input path keeps per layer: the GEMM, the input scale's reciprocal
    (vLLM quantizes by multiplying with it) and the output scale, each a float32 tensor with
    a dimension (so that a BF16 operand is promoted), per 16-bit input dtype a table, and
    where it can be made the compiled kernel's linear (``native``) or else the GEMM with the
    scales folded in (:func:`_scaled_gemm`)."""

    def __init__(self, kernel: Any, weight: Any, inverse: Any, scale: Any) -> None:
        # lazy: torch-free core
        import torch

        self.inverse, self.scale, self._kernel, self._weight = inverse, scale, kernel, weight
        self.outputs = weight.shape[1]
        dtype = gemm_dtype()
        self.native = _native_linear(weight, scale, inverse)
        folded = self.native is None and dtype == torch.float32
        self.scaled_into = _scaled_gemm(weight, scale) if folded else None
        # The 256 E4M3 values in the GEMM's dtype: a lookup by code is about twice as fast
        # as a cast from FP8 on a CPU.
        self.values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(dtype)
        self.tables: dict[Any, Any] = {}

    def linear(self, values: Any) -> Any:
        """The GEMM with the scales after (float32 inputs, a bias, or no folded GEMM), its
        weight copy made on first use only: a draft that never needs it never holds it."""
        return _gemm(self._kernel, self._weight)[0](values)

    def quantize(self, rows: Any) -> Any:
        """``rows`` quantized as vLLM quantizes a static input (times the reciprocal, clamped
        to the E4M3 range, cast with round-to-nearest-even), as the E4M3 values in the GEMM's
        dtype; never the input, in place.

        A 16-bit input's quantized value is a function of its 16 bits alone, so for BF16
        and float16 inputs it is looked up in a 65,536-entry table made once per layer from
        that very arithmetic (one gather instead of five elementwise passes: the toy draft's
        linears are small enough for those passes to cost more than the GEMM)."""
        # lazy: torch-free core
        import torch

        if rows.dtype.itemsize == 2:
            table = self.tables.get(rows.dtype)
            if table is None:
                every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(rows.dtype)
                table = self.tables[rows.dtype] = self._reference(every)
            # A 16-bit view needs no copy; the index is made contiguous by the cast itself.
            bits = rows.view(torch.uint16).to(torch.int32).view(-1)
            return torch.index_select(table, 0, bits).view(rows.shape)
        return self._reference(rows)

    def _reference(self, rows: Any) -> Any:
        """vLLM's static quantization, elementwise (float32 inputs, and the tables)."""
        # lazy: torch-free core
        import torch

        codes = cpu_fp8_native.quantize_static(rows, self.inverse).view(torch.uint8).long()
        return torch.take(self.values, codes)


def _static_state(kernel: Any, layer: Any) -> _StaticInput | None:
    """The static-input path's state for this layer, made on its first call (None: the
    layer's input scale is not one static value). Made anew if the weight's storage moved
    (a reload). The check reads the layer's registered weight directly: it runs on every
    call, and ``nn.Module`` attribute reads cost more than the rest of it."""
    cached = kernel.__dict__.get("_eaglequant_static")
    if cached is not None and cached[0] is not None:
        current = layer._parameters.get(cached[0])
        if current is not None and current.data_ptr() == cached[1]:
            return cached[2]
    weight, weight_scale, input_scale, _ = kernel._get_layer_params(layer)
    if cached is not None and cached[1] == weight.data_ptr():
        return cached[2]  # a weight that is not a registered parameter: checked the long way
    state = None
    if input_scale is not None and input_scale.numel() == 1:
        inverse = input_scale.float().reshape(1).reciprocal()
        scale = input_scale.float().reshape(1, 1) * weight_scale.float().reshape(1, -1)
        state = _StaticInput(kernel, weight, inverse, scale)
    parameters = getattr(layer, "_parameters", {})
    name = next((key for key, value in parameters.items() if value is weight), None)
    kernel._eaglequant_static = (name, weight.data_ptr(), state)
    return state


def _scaled_gemm(weight: Any, scale: Any) -> Any:
    """``into(out, values)``: ``out = values @ (weight * scale)`` in one call, or None.

    vLLM's oneDNN GEMM over the FP8 weight's values with the per-tensor or per-channel
    scales folded in, in float32 (``weight``: ``(K, N)``; ``scale``: ``(1, N)``), writing
    its float32 sums converted to ``out``'s dtype. The arithmetic is the float32 GEMM's
    with each product's scale applied before the sum instead of after: every product is
    then rounded once in float32 (a relative 2**-24, the size of one float32 addition's
    rounding), and the BF16 result is rounded once, as a GPU rounds it. It saves the
    separate pass that scales and casts. None where vLLM has no oneDNN GEMM or where its
    output fails :func:`_scaled_gemm_holds` in this process."""
    # lazy: vllm is an optional extra
    from vllm import _custom_ops as ops

    if not getattr(ops, "_supports_onednn", False) or not _scaled_gemm_holds():
        return None
    return _folded_gemm(weight, scale, 32)


def _folded_gemm(weight: Any, scale: Any, cache_size: int) -> Any:
    """``into(out, values)`` over vLLM's oneDNN GEMM of ``weight * scale`` in float32
    (``weight``: ``(K, N)``; ``scale``: ``(1, N)``), unchecked: :func:`_scaled_gemm`. The
    closure holds the handler: freeing it frees oneDNN's primitive."""
    # lazy: torch-free core
    import torch

    # lazy: vllm is an optional extra
    from vllm import _custom_ops as ops

    folded = (weight.t().float() * scale.reshape(-1, 1)).contiguous()  # (N, K)
    handler = ops.create_onednn_mm(folded.t(), cache_size)
    run, kept = torch.ops._C.onednn_mm, (handler, folded)

    def into(out: Any, values: Any, _kept: Any = kept) -> None:
        run(out, values, None, _kept[0].handler_tensor)

    return into


@functools.cache
def _scaled_gemm_holds() -> bool:
    """Whether vLLM's oneDNN GEMM, given a BF16 output, writes its float32 sums rounded to
    BF16 (checked once a process on E4M3 values against float64: every element within one
    BF16 step of the exact product, nearly all equal to it rounded). Another vLLM build
    could write the input's dtype into it, as it does for a float32 output of a BF16 GEMM."""
    # lazy: torch-free core
    import torch

    generator = torch.Generator().manual_seed(0)
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[values.isfinite()]
    pick = lambda *shape: values[torch.randint(len(values), shape, generator=generator)]  # noqa: E731
    x, w = pick(24, 96), pick(40, 96)
    scale = torch.rand(1, 40, generator=generator) + 0.01
    out = torch.empty(24, 40, dtype=torch.bfloat16)
    try:
        _folded_gemm(w.t(), scale, 1)(out, x)
    except RuntimeError:
        return False
    exact = (x.double() @ w.double().t()) * scale.double()
    rounded = exact.bfloat16()
    _, exponent = torch.frexp(exact)
    step = torch.ldexp(torch.ones_like(exact), exponent - 8)  # one BF16 step at each value
    return bool(
        out.isfinite().all()
        and ((out.double() - exact).abs() <= step).all()
        and (out == rounded).float().mean() >= 0.99
    )


def plain_scaled_mm(
    self: Any,
    *,
    A: Any,
    B: Any,
    out_dtype: Any,
    As: Any,
    Bs: Any,
    bias: Any,
    output_shape: list[int],
) -> Any:
    """``C = (s_x * A) (s_w * B) + bias``, as vLLM's torch FP8 kernels define it (A already
    quantized: dynamic or per-token inputs)."""
    tokens = math.prod(output_shape[:-1])
    linear, dtype = _gemm(self, B)
    out = linear(A[:tokens].to(dtype)).float()
    if As.numel() == 1 and Bs.numel() == 1:
        out.mul_(As.reshape(1, 1).float() * Bs.reshape(1, 1).float())
    else:
        out.mul_(As.reshape(-1, 1)[:tokens].float() if As.numel() > 1 else As.float().reshape(1, 1))
        out.mul_(Bs.reshape(1, -1).float() if Bs.numel() > 1 else Bs.float().reshape(1, 1))
    if bias is not None:
        out.add_(bias)
    return out.to(out_dtype).view(*output_shape)


def _gemm(kernel: Any, weight: Any) -> tuple[Any, Any]:
    """vLLM's CPU GEMM over the FP8 weight's values (``weight``: ``(K, N)``, as vLLM's torch
    FP8 kernels hold it) in :func:`gemm_dtype`, made once per weight tensor and kept."""
    # lazy: torch-free core
    import torch

    # lazy: vllm is an optional extra
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    key = (weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()))
    cached = getattr(kernel, "_eaglequant_gemm", None)
    if cached is None or cached[0] != key:
        holder = torch.nn.Module()
        values = weight.t().to(gemm_dtype()).contiguous()  # (N, K), exact
        holder.weight = torch.nn.Parameter(values, requires_grad=False)
        dispatch_cpu_unquantized_gemm(holder, remove_weight=False)
        cached = (key, holder)
        kernel._eaglequant_gemm = cached
    built: Any = cached[1]
    return (lambda x: built.cpu_linear(x, built.weight, None)), built.weight.dtype
