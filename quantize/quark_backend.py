"""Quantization by AMD Quark: recipe -> ``QConfig``, then Quark's own flows.

* Static activation scales: ``ModelQuantizer.quantize_model`` calibrates the
  float32 draft module on the calibration batches, ``freeze`` fixes its scales, and
  ``export_safetensors`` writes real FP8 weights and float32 scales. The math is
  float32 (a BF16 model makes Quark divide in BF16 before the FP8 cast). Only
  while its forward passes run do the decoder layers' linears hold BF16 weights
  where BF16 GEMMs are native here (their inputs are BF16 then, as in vLLM;
  Quark's observers take the amax in BF16, exactly, and divide in float32).
* Dynamic activations (``ptpc-fp8``, ``fp8-dynamic``): Quark's file-to-file
  flow ``ModelQuantizer.direct_quantize_checkpoint`` on a scratch folder that
  holds only the decoder layers' linear weights, the flow AMD's published card used,
  run in a worker process started with the export (:mod:`.file_to_file`).

Either way only the decoder layers' quantized tensors and Quark's
``quantization_config`` are taken from Quark's output; everything else is
passed through from the input byte for byte by the writer.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from quark.common.utils.log import ScreenLogger  # Quark's loggers alone: the logging module

from eaglequant.interpreter import collection_paused
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.model_config import QuantizationConfig
from eaglequant.model import compute
from eaglequant.quantize.file_to_file import SCRATCH_PREFIX, FileToFile, in_memory_scratch
from eaglequant.recipe import FP8_E4M3_MAX, MX_DTYPES, Recipe
from eaglequant.rules.draft import SCALE_SUFFIXES, kv_scale_name

if TYPE_CHECKING:  # the draft module's transformers is imported by the flow that builds one
    from eaglequant.model.eagle3 import Eagle3Draft

UNQUANTIZED_MODULES = ("fc", "lm_head", "embed_tokens")
KV_PROJECTIONS = ("*k_proj", "*v_proj")  # their outputs are the KV cache (Quark's patterns)
LAYER_MODULES = ("midlayer.", "layers.")  # the decoder layers, whose linears Quark quantizes


@dataclass
class QuarkResult:
    """Quark's quantized midlayer tensors, its ``quantization_config`` and where time went."""

    tensors: dict[str, torch.Tensor]
    quantization_config: QuantizationConfig
    timings: dict[str, float] = field(default_factory=dict)


def import_quark() -> float:
    """Import ``quark.torch`` (with :func:`quiet_quark` settings, its expert-class scan
    skipped by :func:`experts_scan_skipped`, the garbage collector paused, and its OCP MXFP8
    export completed by :func:`export_per_group_fp8`); return the seconds it took."""
    quiet_quark()
    started = time.perf_counter()
    with experts_scan_skipped(), collection_paused():
        # lazy: Quark's slow import
        import quark.torch  # noqa: F401

    export_per_group_fp8()
    return round(time.perf_counter() - started, 3)


# Quark's import scans every transformers modeling file for MoE expert classes: it parses each
# with ``ast.parse`` in this function, imports the modules whose classes carry this decorator
# and registers those classes for module replacement in ``quantize_model``.
EXPERTS_SCAN = "_find_decorated_experts_classes"
EXPERTS_DECORATOR = "use_experts_implementation"


@contextlib.contextmanager
def experts_scan_skipped() -> Iterator[None]:
    """While Quark is imported, every file its expert-class scan parses is given an empty
    module: no modeling module is parsed or imported for it and no expert class registered.

    eaglequant hands Quark only its own draft module (``Eagle3Draft``: eaglequant's layers
    and torch's, a dense MLP) or a folder of weights (the file-to-file flow), so none of
    those transformers classes can occur in what Quark replaces. ``import quark.torch``
    then took 5.7 s, against 7.4 s with the scan restricted to the files that name the
    decorator and more than twice that with all of it (a 2-core EPYC, the garbage collector
    running). Any other ``ast.parse`` call is untouched.
    """
    original = ast.parse

    def parse(source: Any, *args: Any, **kwargs: Any) -> Any:
        if sys._getframe(1).f_code.co_name == EXPERTS_SCAN:
            return ast.Module(body=[], type_ignores=[])
        return original(source, *args, **kwargs)

    ast.parse = parse  # type: ignore[assignment]
    try:
        yield
    finally:
        ast.parse = original


def export_per_group_fp8() -> None:
    """Give Quark's export the per-group FP8 E4M3 real quantization its calibration already has.

    Quark 0.13 calibrates and fake-quantizes OCP MXFP8 (``OCP_MXFP8E4M3Spec``:
    FP8 E4M3 per group of 32 with E8M0 scales) but its export dispatch,
    ``DTYPE_TO_REAL_QUANTIZE_FUNCS["fp8_e4m3"]``, knows per-tensor and per-channel
    only ("Unsupported QuantSchema: per_group for quant_dtype: fp8_e4m3"). The
    entry is wrapped so that per_group runs :func:`real_quantize_fp8_per_group`,
    the real counterpart of Quark's own ``fake_quantize_fp8_per_group_with_scale``
    (same blocks, same division and clamp, the same cast, without the multiply
    back); every other scheme goes to Quark's function unchanged. Idempotent.
    """
    # lazy: Quark's slow import
    from quark.torch.kernel.hw_emulation import hw_emulation_interface as quark_kernels

    table = quark_kernels.DTYPE_TO_REAL_QUANTIZE_FUNCS
    original = table["fp8_e4m3"]
    if getattr(original, "per_group_fp8", False):
        return

    def real_quantize_fp8_e4m3(inputs: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("qscheme") == "per_group":
            return real_quantize_fp8_per_group(
                inputs, kwargs["scale"], kwargs["axis"], kwargs["group_size"]
            )
        return original(inputs, **kwargs)

    real_quantize_fp8_e4m3.per_group_fp8 = True  # type: ignore[attr-defined]
    table["fp8_e4m3"] = real_quantize_fp8_e4m3


def real_quantize_fp8_per_group(
    inputs: torch.Tensor, scale: torch.Tensor, axis: int, group_size: int
) -> torch.Tensor:
    """FP8 E4M3 values of ``inputs`` divided by one ``scale`` per ``group_size`` elements
    along ``axis`` (the layout Quark's per-group fake quantization reads)."""
    # lazy: Quark's slow import
    from quark.torch.quantization.utils import reshape_to_blocks

    shape = list(inputs.shape)
    shape[-1], shape[axis] = shape[axis], shape[-1]
    scale = scale.masked_fill(scale == 0.0, torch.finfo(torch.float32).eps).to(torch.float32)
    blocks = reshape_to_blocks(inputs.to(torch.float32), group_size, axis)
    if scale.dim() < blocks.dim():
        scale = scale.unsqueeze(-1)
    values = (blocks / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    values = values.reshape(values.size(0), -1)[:, : shape[-1]].reshape(shape)
    return values.transpose(axis, -1).contiguous()


def quark_config(recipe: Recipe) -> Any:
    """The Quark ``QConfig`` for ``recipe``."""
    # lazy: Quark's slow import
    from quark.torch.quantization.config.config import QConfig, QLayerConfig

    weight = _weight_spec(recipe).to_quantization_spec()
    inputs = _input_spec(recipe).to_quantization_spec()
    layer = QLayerConfig(weight=weight, input_tensors=inputs)
    kv_layers = {}
    if recipe.kv_cache.scaled:  # the layout of Quark's own LLM template (kv_cache_scheme="fp8")
        # lazy: Quark's slow import
        from quark.torch.quantization.config.config import FP8E4M3PerTensorSpec

        output = FP8E4M3PerTensorSpec(observer_method="min_max", is_dynamic=False)
        kv = QLayerConfig(
            weight=weight, input_tensors=inputs, output_tensors=output.to_quantization_spec()
        )
        kv_layers = {pattern: kv for pattern in KV_PROJECTIONS}
    return QConfig(
        global_quant_config=layer,
        layer_quant_config=dict(kv_layers),
        kv_cache_quant_config=dict(kv_layers),
        kv_cache_group=list(KV_PROJECTIONS) if kv_layers else [],
        exclude=list(recipe.exclude),
    )


def _weight_spec(recipe: Recipe) -> Any:
    # lazy: Quark's slow import
    from quark.torch.quantization.config.config import (
        FP8E4M3PerChannelSpec,
        FP8E4M3PerTensorSpec,
    )

    weight = recipe.weight
    if weight.dtype in MX_DTYPES:
        return _mx_spec(weight.dtype, is_dynamic=False)
    if weight.granularity == "per_channel":
        return FP8E4M3PerChannelSpec(ch_axis=0, is_dynamic=False, scale_type=recipe.scale_type)
    return FP8E4M3PerTensorSpec(
        observer_method="min_max", scale_type=recipe.scale_type, is_dynamic=False
    )


def _input_spec(recipe: Recipe) -> Any:
    # lazy: Quark's slow import
    from quark.torch.quantization.config.config import (
        FP8E4M3PerChannelSpec,
        FP8E4M3PerTensorSpec,
    )

    act = recipe.activation
    if act.dtype in MX_DTYPES:
        return _mx_spec(act.dtype, is_dynamic=True)
    if act.granularity == "per_token":
        return FP8E4M3PerChannelSpec(ch_axis=1, is_dynamic=True, scale_type=recipe.scale_type)
    return FP8E4M3PerTensorSpec(
        observer_method="min_max", scale_type=recipe.scale_type, is_dynamic=act.dynamic
    )


def _mx_spec(dtype: str, *, is_dynamic: bool) -> Any:
    """Quark's OCP MX spec: E8M0 scales per 32 elements along the last (input) dimension."""
    # lazy: Quark's slow import
    from quark.torch.quantization.config.config import OCP_MXFP4Spec, OCP_MXFP8E4M3Spec

    spec = OCP_MXFP4Spec if dtype == "mxfp4" else OCP_MXFP8E4M3Spec
    return spec(ch_axis=-1, is_dynamic=is_dynamic)


def quiet_quark() -> None:
    """Settings read when Quark is imported: quieter logs, no torch.compile.

    Quark logs every config at INFO; keep the terminal for our own progress. Its
    fake-quantize kernel is wrapped in ``torch.compile``, which for a one-shot
    export costs more than it saves (an inductor C++ build per process).

    The level is set as the one Quark's loggers start with, not by ``QUARK_LOG_LEVEL``
    (which a user's environment still overrides): with that variable set, each of the
    ~100 loggers Quark's import creates sets the level of all those before it, and every
    ``setLevel`` clears the cache of every logger in the process: 0.1-0.2 s of the import
    on a 2-core EPYC.
    """
    os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
    if "QUARK_LOG_LEVEL" not in os.environ:
        ScreenLogger.set_shared_level(logging.WARNING)  # the one logger made so far, and later ones
    for name in ("quark", "quark.torch"):
        logging.getLogger(name).setLevel(logging.WARNING)


def quantize_static(
    model: Eagle3Draft,
    recipe: Recipe,
    batches: Iterable[dict[str, torch.Tensor]] | None,
    scratch: Path,
) -> QuarkResult:
    """Calibrate ``model`` (float32 Eagle3Draft) with Quark and export its FP8 decoder layers.

    ``batches`` None means no calibration data: every static input scale is set
    from the recipe's ``fixed_input_amax`` instead (dynamic inputs need none).
    """
    timings = {"import_quark": import_quark()}
    # lazy: Quark's slow import
    from quark.torch import ModelQuantizer, export_safetensors

    started = time.perf_counter()
    quantizer = ModelQuantizer(quark_config(recipe))
    if batches is None:
        # Quark insists on a dataloader for static inputs: give it one all-zero batch,
        # then set every input scale from the recipe's assumed range.
        with _embeddings_for_zero_batch(model):
            quantized = quantizer.quantize_model(model, [_zero_batch(model)])
        if recipe.needs_calibration:
            _set_fixed_input_scales(quantized, recipe.calibration.fixed_input_amax / FP8_E4M3_MAX)
    else:
        with _native_while_calibrating(model):
            quantized = quantizer.quantize_model(model, list(batches))
    timings["quark_calibration"] = round(time.perf_counter() - started, 3)
    model.release_file_pages()
    # Quark's export real-quantizes each weight from the float weight it finds. freeze's
    # default would first fake-quantize every weight in place, seconds at full size, and
    # change no exported byte (tests/integration/test_quark_freeze.py).
    frozen = quantizer.freeze(quantized, quantize=False)
    # Quark's export writes the whole state dict; only the decoder layers are wanted, so the
    # unquantized gigabytes (fc, lm_head, embed_tokens) are detached while it runs.
    detached = {name: getattr(frozen, name) for name in UNQUANTIZED_MODULES}
    try:
        for name in UNQUANTIZED_MODULES:
            setattr(frozen, name, None)
        export_safetensors(frozen, scratch)
    finally:
        for name, module in detached.items():
            setattr(frozen, name, module)
    return _collect(scratch, model.dims.linears, timings)


@contextlib.contextmanager
def _native_while_calibrating(model: Eagle3Draft) -> Iterator[None]:
    """Quark's forward passes with the decoder layers' linear weights in the draft's GEMM dtype
    (BF16) where GEMMs in it are native here and the weights hold its values exactly
    (else in float32, as Quark holds them).

    Quark observes the weights (float32) before its first forward pass and
    quantizes them at export, after the last: the weights turn BF16 at
    the first forward pass and float32 again on leaving, both exact, and are
    held once either way.
    """
    dtype = model.gemm_dtype
    device = next(model.fc.parameters()).device
    if dtype == torch.float32 or not compute.runs_natively(dtype, device):
        yield
        return

    def weights() -> list[torch.nn.Parameter]:
        return [
            param
            for name in model.dims.linears
            for param in model.get_submodule(name).parameters(recurse=False)
        ]

    def to_gemm_dtype(_module: torch.nn.Module, _args: tuple[Any, ...]) -> None:
        if converted:
            return
        converted.append(all(torch.equal(p.data.to(dtype).float(), p.data) for p in weights()))
        if converted[0]:
            for param in weights():
                param.data = param.data.to(dtype)

    converted: list[bool] = []
    hook = model.register_forward_pre_hook(to_gemm_dtype)
    try:
        yield
    finally:
        hook.remove()
        for param in weights():
            param.data = param.data.float()


def _zero_batch(model: Eagle3Draft) -> dict[str, torch.Tensor]:
    dims, device = model.dims, next(model.fc.parameters()).device
    return {
        "aux_hidden": torch.zeros(1, 2, dims.fc_in, device=device),
        "next_ids": torch.zeros(1, 2, dtype=torch.long, device=device),
    }


@contextlib.contextmanager
def _embeddings_for_zero_batch(model: Eagle3Draft) -> Iterator[None]:
    """A draft without embed_tokens gets all-zero stand-ins (one shared row) for the zero batch.

    Its inputs only feed observers whose input scales are then set from the recipe.
    """
    if model.embed_tokens is not None:
        yield
        return
    dims = model.dims
    device = next(model.fc.parameters()).device
    zeros = torch.zeros(1, dims.hidden, dtype=torch.bfloat16, device=device)
    zeros = zeros.expand(dims.vocab, dims.hidden)
    model.embed_tokens = torch.nn.Embedding.from_pretrained(zeros, freeze=True)
    try:
        yield
    finally:
        model.embed_tokens = None


def _set_fixed_input_scales(model: torch.nn.Module, scale: float) -> None:
    for name, module in model.named_modules():
        quantizer = getattr(module, "_input_quantizer", None)
        if name.startswith(LAYER_MODULES) and quantizer is not None:
            quantizer.scale.data.fill_(scale)


def quantize_file_to_file(file_to_file: FileToFile) -> QuarkResult:
    """Quark's ``direct_quantize_checkpoint`` on the decoder layers' linears alone (its worker)."""
    folder = file_to_file.run()
    timings = {"quark_file_to_file": file_to_file.timings["quark_file_to_file"]}
    return _collect(folder, file_to_file.linears, timings)


def _collect(folder: Path, linears: tuple[str, ...], timings: dict[str, float]) -> QuarkResult:
    """Read Quark's output folder: ``linears``' quantized tensors, its quantization_config."""
    written = read_checkpoint(folder)
    quantized = {f"{m}{part}" for m in linears for part in (".weight", *SCALE_SUFFIXES)}
    wanted = [n for n in written.tensors if n in quantized]  # biases pass through from the input
    tensors = {name: written.load_tensor(name) for name in wanted}
    for linear in linears:  # K/V scales, renamed for vLLM's EAGLE-3 loader (see KV_SCALES)
        output_scale, name = f"{linear}.output_scale", kv_scale_name(linear)
        if output_scale in written.tensors and name is not None:
            tensors[name] = written.load_tensor(output_scale).float()
    return QuarkResult(tensors, written.flat_config["quantization_config"], timings)


def scratch_dir(parent: Path, staged: int) -> tempfile.TemporaryDirectory[str]:
    """A scratch folder for Quark's own output, removed afterwards: in shared memory where it
    has room for the decoder layers' ``staged`` BF16 bytes (:func:`in_memory_scratch`), else
    under ``parent``, so that its gigabytes are not written to the disk beside the output's."""
    return tempfile.TemporaryDirectory(
        prefix=SCRATCH_PREFIX, dir=in_memory_scratch(staged) or parent
    )
