"""``eaglequant inspect``: what a draft folder holds and what vLLM will make of it.

Reads headers only (plus the few bytes of FP8 scale tensors), so it runs in
well under a second on a multi-GB checkpoint and never imports torch.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eaglequant.io.checkpoint import Checkpoint, read_checkpoint
from eaglequant.io.model_config import QuantizationConfig
from eaglequant.io.safetensors_header import FLOAT_DTYPES
from eaglequant.quantization import METHODS, QuantMethod, method_of
from eaglequant.quantization.base import block_refusal
from eaglequant.recipe import E8M0_NAN
from eaglequant.rules.draft import (
    SCALE_SUFFIXES,
    STORED_SCALE_SUFFIXES,
    DraftDims,
    Problem,
    dims_from_config,
    draft_form,
    quantized_tensors,
    structure_problems,
)
from eaglequant.rules.exclusions import (
    DEFAULT_TARGET_LAYERS,
    LayerFate,
    draft_linear_names,
    predict_fates,
)
from eaglequant.rules.vocab_maps import read_floats, vocab_map_problems


@dataclass(frozen=True)
class SizeSummary:
    """Bytes on disk and how many of the draft's parameters are stored quantized.

    A packed MXFP4 byte holds two parameters; scales are not parameters.
    """

    bytes_on_disk: int
    parameters: int
    quantized_parameters: int

    @property
    def quantized_fraction(self) -> float:
        return self.quantized_parameters / self.parameters if self.parameters else 0.0


def size_summary(ckpt: Checkpoint) -> SizeSummary:
    """The tensors' bytes (headers aside) and their parameters, quantized or not."""
    total = quantized = 0
    for name, info in ckpt.tensors.items():
        if name.endswith(STORED_SCALE_SUFFIXES):
            continue
        count = math.prod(info.shape) * (2 if info.dtype == "U8" else 1)
        total += count
        quantized += count if info.dtype not in FLOAT_DTYPES else 0
    return SizeSummary(ckpt.total_bytes, total, quantized)


@dataclass(frozen=True)
class QuantSummary:
    """The checkpoint's ``quantization_config`` in brief, as vLLM reads it: the method, the
    key it reads exclusions from and their entries (``kv_cache_group``: Quark's only)."""

    quant_method: str | None
    version: str | None
    method: str | None  # the producer, for a method eaglequant predicts; None: unknown
    summary: str
    exclusion_key: str | None
    exclusions: list[str]
    kv_cache_group: list[str] | None = None


@dataclass
class InspectReport:
    """Everything ``inspect`` prints, as data (``--json`` dumps it)."""

    path: str
    architectures: list[str]
    form: str
    dims: DraftDims | None  # None: the folder is not a draft these dimensions describe
    tensor_count: int
    bytes_by_dtype: dict[str, int]
    shards: list[str]
    quantization: QuantSummary | None
    size: SizeSummary | None = None
    fates: list[LayerFate] = field(default_factory=list)
    scales: dict[str, list[float]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["dims"] = data["dims"] or {}
        data["problems"] = [str(p) for p in self.problems]
        if self.size is not None:
            data["size"]["quantized_fraction"] = self.size.quantized_fraction
        return data


def inspect_checkpoint(path: Path, target_layers: int = DEFAULT_TARGET_LAYERS) -> InspectReport:
    """Read ``path`` and collect its summary, vLLM fate table and problems."""
    ckpt = read_checkpoint(path)
    problems = structure_problems(ckpt)
    recognised = not problems or problems[0].loadable
    dims = None if problems else dims_from_config(ckpt.flat_config)
    bytes_by_dtype: Counter[str] = Counter()
    for info in ckpt.tensors.values():
        bytes_by_dtype[info.dtype] += info.nbytes
    fates = predict_fates(ckpt.flat_config, target_layers)
    scales = read_scales(ckpt)
    if not problems:
        problems += quantization_problems(ckpt, fates, scales, target_layers)
    return InspectReport(
        path=str(path),
        architectures=list(ckpt.flat_config.get("architectures") or []),
        form=draft_form(ckpt) if recognised else "unrecognised",
        dims=dims,
        tensor_count=len(ckpt.tensors),
        bytes_by_dtype=dict(sorted(bytes_by_dtype.items())),
        shards=list(ckpt.shard_files),
        quantization=_quant_summary(ckpt.flat_config.get("quantization_config")),
        size=size_summary(ckpt) if recognised else None,
        fates=[_as_stored(ckpt, fate) for fate in fates],
        scales={ckpt.tensors[name].name: values for name, values in scales.items()},
        problems=problems,
    )


def _as_stored(ckpt: Checkpoint, fate: LayerFate) -> LayerFate:
    """``fate`` naming the checkpoint's modules as the folder stores them."""
    return replace(fate, checkpoint_names=tuple(ckpt.stored_name(n) for n in fate.checkpoint_names))


def _quant_summary(qcfg: QuantizationConfig | None) -> QuantSummary | None:
    if not isinstance(qcfg, dict):
        return None
    method = method_of(qcfg)
    if method is None:
        return QuantSummary(
            qcfg.get("quant_method"), qcfg.get("version"), None, "not predicted", None, []
        )
    return QuantSummary(
        quant_method=qcfg.get("quant_method"),
        version=qcfg.get("version"),
        method=method.label,
        summary=method.describe(qcfg),
        exclusion_key=".".join(method.exclusion_path(qcfg)),
        exclusions=method.exclusions(qcfg),
        kv_cache_group=(qcfg.get("export") or {}).get("kv_cache_group")
        if method.name == "quark"
        else None,
    )


def read_scales(ckpt: Checkpoint) -> dict[str, list[float]]:
    """Values of every float ``*_scale`` tensor (a few bytes each; float32, or BF16 as
    llm-compressor writes them), read without torch."""
    return {
        name: read_floats(ckpt, name)
        for name, info in sorted(ckpt.tensors.items())
        if name.endswith("_scale") and info.dtype in FLOAT_DTYPES
    }


def quantization_problems(
    ckpt: Checkpoint,
    fates: list[LayerFate],
    scales: dict[str, list[float]],
    target_layers: int,
) -> list[Problem]:
    """Mismatches between the quantization_config, vLLM's reading of it, and the tensors."""
    config_path = str(ckpt.folder / "config.json")
    qcfg = ckpt.flat_config.get("quantization_config")
    problems = vocab_map_problems(ckpt)
    if not isinstance(qcfg, dict):
        quantized = quantized_tensors(ckpt)
        if quantized:
            problems.append(
                Problem(
                    config_path,
                    f"no quantization_config but tensor '{quantized[0]}' is quantized",
                    "re-export with eaglequant export",
                )
            )
        return problems
    method = method_of(qcfg)
    if method is None:
        problems.append(
            Problem(
                config_path,
                f"quantization_config.quant_method {qcfg.get('quant_method')!r} is not one "
                "eaglequant predicts vLLM's layers for "
                f"({', '.join(m.name for m in METHODS)})",
                "nothing here can say how vLLM builds this draft; quantize it with one of those",
            )
        )
        return problems
    refusals = method.config_problems(qcfg)
    problems += [Problem(config_path, message, fix) for message, fix in refusals]
    problems += _exclusion_problems(ckpt, method, qcfg, fates, target_layers)
    refused = {message.removeprefix("vLLM refuses it: ") for message, _ in refusals}
    for fate in fates:
        if fate.scheme == "error" and fate.reason.removeprefix("vLLM refuses it: ") in refused:
            continue
        problems += _fate_problems(ckpt, method, qcfg, fate, scales)
    return problems


def _exclusion_problems(
    ckpt: Checkpoint,
    method: QuantMethod,
    qcfg: QuantizationConfig,
    fates: list[LayerFate],
    target_layers: int,
) -> list[Problem]:
    """Entries of the list vLLM reads that match no vLLM module while their author's meaning
    would: those whose meant layer is stored BF16 and built quantized (the seed's pitfall)."""
    names = list(draft_linear_names(ckpt.flat_config, target_layers))
    key = ".".join(method.exclusion_path(qcfg))
    cast = {f.vllm_name for f in fates if f.quantized and not _stored_quantized(ckpt, f)}
    problems = []
    for entry in method.exclusions(qcfg):
        if method.matches_any(entry, names):
            continue
        meant = method.rewrite([entry], names)[0]
        missed = [n for n in names if n in cast and _matches(method, n, meant)]
        if not missed:
            continue
        problems.append(
            Problem(
                str(ckpt.folder / "config.json"),
                f"{key} entry '{entry}' matches no vLLM module; vLLM would quantize "
                f"{', '.join(missed)}",
                f"run `eaglequant fix-config {ckpt.folder}`",
            )
        )
    return problems


def _matches(method: QuantMethod, name: str, entry: str) -> bool:
    try:
        return method.excluded(name, [entry])
    except ValueError:
        return True


def _stored_quantized(ckpt: Checkpoint, fate: LayerFate) -> bool:
    """Whether any of the layer's checkpoint weights is stored quantized (FP8, packed MX)."""
    return any(
        (w := ckpt.tensors.get(f"{source}.weight")) is not None and w.dtype not in FLOAT_DTYPES
        for source in fate.checkpoint_names
    )


def _fate_problems(
    ckpt: Checkpoint,
    method: QuantMethod,
    qcfg: QuantizationConfig,
    fate: LayerFate,
    scales: dict[str, list[float]],
) -> list[Problem]:
    key = ".".join(method.exclusion_path(qcfg))
    if fate.scheme == "error":
        return [
            Problem(
                fate.vllm_name, fate.reason, f"list all shards of a fused layer in {key} or none"
            )
        ]
    if fate.scheme == "unknown":
        return []
    problems = []
    for source in fate.checkpoint_names:
        weight = ckpt.tensors.get(f"{source}.weight")
        if weight is None:
            continue
        is_quantized = weight.dtype not in FLOAT_DTYPES  # FP8, or MXFP4's packed bytes
        if fate.quantized and not is_quantized:
            problems.append(
                Problem(
                    fate.vllm_name,
                    f"vLLM would build it as {fate.scheme} but '{source}.weight' is "
                    f"{weight.dtype} (vLLM loads it into a quantized layer with placeholder "
                    "scales)",
                    f"exclude it in {key}: run `eaglequant fix-config {ckpt.folder}`",
                )
            )
        elif not fate.quantized and is_quantized:
            problems.append(
                Problem(
                    fate.vllm_name,
                    f"'{source}.weight' is {weight.dtype} but vLLM would build the layer "
                    f"unquantized ({fate.reason})",
                    f"remove it from {key} (`eaglequant fix-config {ckpt.folder}`) or re-export",
                )
            )
        elif fate.quantized:
            problems += _scale_problems(source, fate, ckpt, scales)
        else:
            problems += _stray_scale_problems(ckpt, fate, source)
    if fate.quantized and fate.block is not None:
        problems += _block_problems(ckpt, fate, fate.block)
    return problems


def _stray_scale_problems(ckpt: Checkpoint, fate: LayerFate, source: str) -> list[Problem]:
    """Scales of a BF16-stored layer that vLLM builds unquantized: nothing to load them into."""
    return [
        Problem(
            f"{ckpt.tensors[name].file}: tensor '{ckpt.tensors[name].name}'",
            f"scales '{source}', stored BF16, which vLLM builds unquantized ({fate.reason}): "
            "its layer has no parameter for it",
            "re-export from the BF16 draft",
        )
        for suffix in SCALE_SUFFIXES
        if (name := f"{source}{suffix}") in ckpt.tensors
    ]


def _block_problems(ckpt: Checkpoint, fate: LayerFate, block: tuple[int, int]) -> list[Problem]:
    """vLLM's refusal of a block size that does not divide the layer's partitions (TP=1)."""
    weights = [ckpt.tensors.get(f"{source}.weight") for source in fate.checkpoint_names]
    sizes = [w.shape[0] for w in weights if w is not None and w.shape]
    refusal = block_refusal(block, sizes) if len(sizes) == len(weights) else None
    if refusal is None:
        return []
    return [
        Problem(
            fate.vllm_name,
            f'vLLM would refuse it: "{refusal}"',
            "quantize with a block size that divides every shard, or per-channel weights",
        )
    ]


def _scale_problems(
    source: str, fate: LayerFate, ckpt: Checkpoint, scales: dict[str, list[float]]
) -> list[Problem]:
    needed = [f"{source}.weight_scale"]
    if fate.static_input:
        needed.append(f"{source}.input_scale")
    problems = []
    for name in needed:
        if name not in ckpt.tensors:
            problems.append(
                Problem(
                    str(ckpt.folder),
                    f"tensor '{ckpt.stored_name(name)}' is missing; vLLM would load a placeholder "
                    "(-3.4e38) scale",
                    "re-export the draft",
                )
            )
            continue
        if ckpt.tensors[name].dtype == "U8":  # OCP MX: E8M0 exponent bytes
            if E8M0_NAN in ckpt.read_raw(name):
                problems.append(
                    Problem(
                        f"{ckpt.tensors[name].file}: tensor '{ckpt.tensors[name].name}'",
                        f"holds the E8M0 NaN exponent ({E8M0_NAN})",
                        "re-export the draft",
                    )
                )
            continue
        values = scales.get(name, [])
        if not values or not all(math.isfinite(v) and v > 0 for v in values):
            problems.append(
                Problem(
                    f"{ckpt.tensors[name].file}: tensor '{ckpt.tensors[name].name}'",
                    "must hold finite positive scales",
                    "re-export the draft",
                )
            )
    return problems
