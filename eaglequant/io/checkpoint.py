"""Reading a model folder: ``config.json`` plus single-file or sharded safetensors.

Only headers are read here; tensor data is fetched lazily, one tensor at a
time, through ``safetensors.safe_open`` when asked. Pickle-based weights are
refused, never loaded. Every shard named by an index must be a plain file
name inside the folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from eaglequant.errors import InputError
from eaglequant.io import speculators
from eaglequant.io.model_config import DraftConfig, StoredConfig
from eaglequant.io.safetensors_header import TensorInfo, read_header

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@dataclass(frozen=True)
class Checkpoint:
    """A model folder whose config and safetensors headers were read and checked.

    ``flat_config`` and the keys of ``tensors`` are the draft as vLLM sees it in the
    EAGLE-3 layout (a speculators-format folder flattened, ``layers.0.*`` read as
    ``midlayer.*``; one vLLM would refuse stays as stored); ``stored_config`` and
    each ``TensorInfo.name`` are the folder's own.
    """

    folder: Path
    flat_config: DraftConfig
    tensors: dict[str, TensorInfo]
    shard_files: tuple[str, ...]
    sharded: bool
    stored_config: StoredConfig
    speculators_format: bool = False
    layer_prefix: str = speculators.CANONICAL_PREFIX  # the decoder layer's stored names

    @property
    def config(self) -> dict[str, Any]:
        """``flat_config`` as the plain JSON object it is, for what passes it on whole
        (transformers' ``LlamaConfig``, the model card)."""
        return cast("dict[str, Any]", self.flat_config)

    def stored_name(self, name: str) -> str:
        """The name tensor ``name`` (EAGLE-3 layout) has in this folder."""
        return speculators.stored_name(name, self.layer_prefix)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def load_tensor(self, name: str) -> torch.Tensor:
        """Load one tensor's data (a copy, safe to modify)."""
        # lazy: torch-free core
        from safetensors import safe_open

        info = self.tensors[name]
        with safe_open(str(info.file), framework="pt") as handle:
            return handle.get_tensor(info.name)

    def read_raw(self, name: str) -> bytes:
        """The tensor's bytes exactly as stored."""
        info = self.tensors[name]
        with info.file.open("rb") as handle:
            handle.seek(info.start)
            return handle.read(info.nbytes)


def read_config(folder: Path) -> StoredConfig:
    """Read ``config.json`` as a JSON object (a target's or a draft's, as stored)."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise InputError(
            f"{path}: missing; a model folder needs its config.json (copy it from the source model)"
        )
    try:
        config: StoredConfig = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); fix or restore the file") from exc
    if not isinstance(config, dict):
        raise InputError(f"{path}: must hold a JSON object, got {type(config).__name__}")
    return config


def read_checkpoint(folder: Path | str) -> Checkpoint:
    """Read a model folder's config and every safetensors header, checking the index."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder; pass the model folder path")
    config = read_config(folder)
    if (folder / INDEX_FILE).exists():
        tensors, shards = _read_sharded(folder)
        return _as_vllm_sees(folder, config, tensors, shards, sharded=True)
    single = folder / SINGLE_FILE
    if single.exists():
        _check_inside(folder, SINGLE_FILE, single)
        _refuse_unindexed_shards(folder, {SINGLE_FILE})
        tensors = read_header(single).tensors
        return _as_vllm_sees(folder, config, tensors, (SINGLE_FILE,), sharded=False)
    _refuse_missing_weights(folder)
    raise AssertionError("unreachable")


def _as_vllm_sees(
    folder: Path,
    stored: StoredConfig,
    tensors: dict[str, TensorInfo],
    shards: tuple[str, ...],
    *,
    sharded: bool,
) -> Checkpoint:
    """The flat config of a speculators-format folder, and ``layers.0.*`` read as ``midlayer.*``.

    A speculators config vLLM would refuse stays as stored (the draft checks report it).
    """
    in_speculators = speculators.is_speculators(stored)
    if in_speculators and speculators.structure_problem(stored):
        return Checkpoint(folder, stored, tensors, shards, sharded, stored)
    flat = speculators.flat_config(stored)
    prefix = speculators.layer_prefix(flat, in_speculators)
    canonical = {speculators.canonical_name(n, prefix): info for n, info in tensors.items()}
    if len(canonical) != len(tensors):
        raise InputError(
            f"{folder}: holds both midlayer.* and {prefix}* tensors; this draft's format "
            f"names its decoder layer {prefix.rstrip('.')} only"
        )
    return Checkpoint(folder, flat, canonical, shards, sharded, stored, in_speculators, prefix)


def _read_sharded(folder: Path) -> tuple[dict[str, TensorInfo], tuple[str, ...]]:
    index_path = folder / INDEX_FILE
    weight_map = _read_weight_map(index_path)
    shard_names = sorted(set(weight_map.values()))
    tensors: dict[str, TensorInfo] = {}
    for shard in shard_names:
        shard_path = folder / shard
        _check_shard_name(folder, index_path, shard, shard_path)
        for name, info in read_header(shard_path).tensors.items():
            if name in tensors:
                raise InputError(
                    f"{folder}: tensor '{name}' is stored in both {tensors[name].file.name} and "
                    f"{shard}; re-export the checkpoint so each tensor is stored once"
                )
            tensors[name] = info
    for name, info in tensors.items():
        if weight_map.get(name) != info.file.name:
            raise InputError(
                f"{index_path}: tensor '{name}' is in {info.file.name} but the index maps it to "
                f"{weight_map.get(name)!r}; fix the weight_map or re-export"
            )
    for name, shard in weight_map.items():
        if name not in tensors:
            raise InputError(
                f"{index_path}: tensor '{name}' is mapped to {shard}, which lacks it; "
                "fix the weight_map or re-export"
            )
    _refuse_unindexed_shards(folder, set(shard_names))
    return tensors, tuple(shard_names)


def _read_weight_map(index_path: Path) -> dict[str, str]:
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{index_path}: not readable JSON ({exc}); restore the index") from exc
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise InputError(
            f"{index_path}: needs a 'weight_map' object mapping tensor names to shard file names"
        )
    return weight_map


def _check_shard_name(folder: Path, index_path: Path, shard: str, shard_path: Path) -> None:
    if shard in ("", ".", "..") or "/" in shard or "\\" in shard or Path(shard).is_absolute():
        raise InputError(
            f"{index_path}: shard name {shard!r} is not a plain file name inside the model "
            "folder; shard paths must stay inside their folder"
        )
    if not shard_path.is_file():
        raise InputError(
            f"{index_path}: names shard {shard}, which does not exist in {folder}; "
            "download the missing shard or fix the index"
        )
    _check_inside(folder, shard, shard_path)


def _check_inside(folder: Path, name: str, path: Path) -> None:
    if not path.resolve().is_relative_to(folder.resolve()):
        raise InputError(
            f"{path}: {name} is a link leading outside the model folder ({path.resolve()}); "
            "copy the file into the folder instead"
        )


def _refuse_unindexed_shards(folder: Path, known: set[str]) -> None:
    extra = sorted(p.name for p in folder.glob("*.safetensors") if p.name not in known)
    if extra:
        raise InputError(
            f"{folder}: {extra[0]} holds weights but is not in the index; add it to "
            f"{INDEX_FILE} or remove it"
        )


def _refuse_missing_weights(folder: Path) -> None:
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise InputError(
            f"{folder / pickled[0]}: pickle-based weights are refused (loading them can run "
            "code); convert the checkpoint to safetensors first"
        )
    raise InputError(
        f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}; the folder holds no safetensors weights"
    )
