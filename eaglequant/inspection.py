"""``eaglequant inspect``: what a draft folder holds and what vLLM will make of it.

Reads headers only (plus the few bytes of FP8 scale tensors), so it runs in
well under a second on a multi-GB checkpoint and never imports torch.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eaglequant.draft import (
    KEEP_UNQUANTIZED,
    STORED_SCALE_SUFFIXES,
    DraftDims,
    Problem,
    dims_from_config,
    draft_form,
    quantized_tensors,
    structure_problems,
)
from eaglequant.exclusions import (
    DEFAULT_TARGET_LAYERS,
    LayerFate,
    draft_linear_names,
    matches,
    predict_fates,
)
from eaglequant.io.checkpoint import Checkpoint, read_checkpoint
from eaglequant.io.model_config import QuantizationConfig
from eaglequant.io.safetensors_header import FLOAT_DTYPES
from eaglequant.recipe import E8M0_NAN


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
    """The checkpoint's ``quantization_config`` in brief (as stored; None where absent)."""

    quant_method: str | None
    version: str | None
    exclude: list[str] | None
    kv_cache_group: list[str] | None


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
    return QuantSummary(
        quant_method=qcfg.get("quant_method"),
        version=qcfg.get("version"),
        exclude=qcfg.get("exclude"),
        kv_cache_group=(qcfg.get("export") or {}).get("kv_cache_group"),
    )


def read_scales(ckpt: Checkpoint) -> dict[str, list[float]]:
    """Values of every float32 ``*_scale`` tensor (a few bytes each), read without torch."""
    scales = {}
    for name, info in sorted(ckpt.tensors.items()):
        if name.endswith("_scale") and info.dtype == "F32":
            raw = ckpt.read_raw(name)
            scales[name] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return scales


def quantization_problems(
    ckpt: Checkpoint,
    fates: list[LayerFate],
    scales: dict[str, list[float]],
    target_layers: int,
) -> list[Problem]:
    """Mismatches between the quantization_config, vLLM's reading of it, and the tensors."""
    config_path = str(ckpt.folder / "config.json")
    qcfg = ckpt.flat_config.get("quantization_config")
    if not isinstance(qcfg, dict):
        quantized = quantized_tensors(ckpt)
        if quantized:
            return [
                Problem(
                    config_path,
                    f"no quantization_config but tensor '{quantized[0]}' is quantized",
                    "re-export with eaglequant export",
                )
            ]
        return []
    problems = _exclude_problems(ckpt, qcfg, config_path, target_layers)
    problems += _kv_cache_group_problem(qcfg, config_path)
    for fate in fates:
        problems += _fate_problems(ckpt, fate, scales)
    return problems


def _exclude_problems(
    ckpt: Checkpoint, qcfg: QuantizationConfig, config_path: str, target_layers: int
) -> list[Problem]:
    names = list(draft_linear_names(ckpt.flat_config, target_layers))
    problems = []
    for entry in qcfg.get("exclude") or []:
        if entry.startswith("re:") or any(matches(n, entry) for n in names):
            continue
        consequence = ""
        if entry in ("fc", "model.fc") or entry.endswith("fc"):
            consequence = "; vLLM would quantize model.fc"
        problems.append(
            Problem(
                config_path,
                f"exclude entry '{entry}' matches no vLLM module{consequence}",
                f"run `eaglequant fix-config {ckpt.folder}`",
            )
        )
    return problems


def _kv_cache_group_problem(qcfg: QuantizationConfig, config_path: str) -> list[Problem]:
    export = qcfg.get("export")
    if not isinstance(export, dict) or not isinstance(export.get("kv_cache_group"), list):
        return [
            Problem(
                config_path,
                "quantization_config.export.kv_cache_group must be a list (vLLM calls len() on it)",
                'set "export": {"kv_cache_group": [], ...}',
            )
        ]
    return []


def _fate_problems(
    ckpt: Checkpoint, fate: LayerFate, scales: dict[str, list[float]]
) -> list[Problem]:
    if fate.scheme == "error":
        return [Problem(fate.vllm_name, fate.reason, "exclude all shards of a fused layer or none")]
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
                    f"exclude it with a regex: run `eaglequant fix-config {ckpt.folder}`",
                )
            )
        elif not fate.quantized and is_quantized:
            problems.append(
                Problem(
                    fate.vllm_name,
                    f"'{source}.weight' is {weight.dtype} but vLLM would build the layer "
                    "unquantized",
                    "remove it from exclude or re-export",
                )
            )
        elif fate.quantized:
            problems += _scale_problems(source, fate, ckpt, scales)
    return problems


def _scale_problems(
    source: str, fate: LayerFate, ckpt: Checkpoint, scales: dict[str, list[float]]
) -> list[Problem]:
    needed = [f"{source}.weight_scale"]
    if fate.scheme.endswith("static") and source not in KEEP_UNQUANTIZED:
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
                    "must hold finite positive float32 scales",
                    "re-export the draft",
                )
            )
    return problems
