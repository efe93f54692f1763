"""``eaglequant fix-config``: make what vLLM builds from a quantized draft match what it stores.

For the draft's quantization method (:mod:`eaglequant.quantization`) it rewrites the one
exclusion list vLLM reads (Quark's ``exclude``, compressed-tensors' ``ignore``, ModelOpt's
``ignore`` or ``quantization.exclude_modules``, ``fp8``'s ``ignored_layers``): an entry vLLM
matches to nothing is rewritten as its author meant it (Quark's ``fc`` -> ``re:.*fc.*``), an
entry that would leave a layer stored quantized to be built unquantized is dropped, and every
layer stored BF16 that vLLM would still build quantized gets an entry of its own. What vLLM
will build is then checked against the stored dtypes; a list it cannot make agree is refused,
nothing written. A speculators-format draft's quantization config is written back at the top
level, where vLLM reads it first.

With ``d2t_from`` (the BF16 draft the quantized one was made from) it also restores ``d2t`` and
``t2d`` that a producer cast to a float: the source's maps are taken only when their cast to
the draft's dtype is exactly what the draft stores.

In place (config.json and a rewritten shard each replaced atomically) or into a new folder
whose other files are hard links (or byte copies) of the originals; the source draft is only
read. A second run changes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from eaglequant.errors import InputError
from eaglequant.io.checkpoint import CONFIG_FILE, INDEX_FILE, Checkpoint, read_checkpoint
from eaglequant.io.layout import TensorBlob, blob_from_file
from eaglequant.io.model_config import QuantizationConfig
from eaglequant.io.output import atomic_output_dir, check_output_path, write_text_atomic
from eaglequant.io.safetensors_header import FLOAT_DTYPES, read_header
from eaglequant.io.speculators import with_quantization_config
from eaglequant.io.writer import FILE_MODE, write_safetensors
from eaglequant.quantization import METHODS, QuantMethod, method_of
from eaglequant.quantization.base import LayerFate
from eaglequant.rules.exclusions import DEFAULT_TARGET_LAYERS, draft_linear_names
from eaglequant.rules.vocab_maps import MAPS, cast_to, is_cast, read_floats, read_ints


@dataclass(frozen=True)
class FixResult:
    """What fix-config did: the exclusion key and its entries before and after, the vocabulary
    maps it restored, and where it wrote."""

    key: str
    before: list[str]
    after: list[str]
    restored: list[str]
    written_to: Path
    changed: bool


def fix_config(
    src: Path,
    out: Path | None = None,
    overwrite: bool = False,
    *,
    d2t_from: Path | None = None,
    target_layers: int = DEFAULT_TARGET_LAYERS,
) -> FixResult:
    """Repair ``src`` (in place when ``out`` is None)."""
    if out is not None:
        check_output_path(out, [src], overwrite)
    ckpt = read_checkpoint(src)
    qcfg = ckpt.flat_config.get("quantization_config")  # the one vLLM reads, in either format
    method = method_of(qcfg)
    if not isinstance(qcfg, dict) or method is None:
        what = (
            f"quantization_config.quant_method {qcfg.get('quant_method')!r} is not one it repairs"
            if isinstance(qcfg, dict)
            else "no quantization_config"
        )
        raise InputError(
            f"{src / CONFIG_FILE}: {what}; fix-config repairs quantized drafts "
            f"({', '.join(m.name for m in METHODS)}) only"
        )
    key = ".".join(method.exclusion_path(qcfg))
    _require_list(src, method, qcfg, key)
    before = method.exclusions(qcfg)
    after = repaired_exclusions(ckpt, method, qcfg, target_layers)
    fixed = method.with_exclusions(qcfg, after) if after != before else qcfg
    config = with_quantization_config(ckpt.stored_config, fixed)
    maps = _restored_maps(ckpt, d2t_from) if d2t_from is not None else {}
    changed = config != ckpt.stored_config or bool(maps)
    text = json.dumps(config, indent=2) + "\n"
    if out is None:
        if changed:
            _write_maps(ckpt, maps, src)
            write_text_atomic(src / CONFIG_FILE, text)
        return FixResult(key, before, after, sorted(maps), src, changed)
    with atomic_output_dir(out, overwrite) as temp:
        rewritten = _write_maps(ckpt, maps, temp)
        for path in sorted(src.iterdir()):
            if path.is_file() and path.name not in {CONFIG_FILE, *rewritten}:
                _link_or_copy(path, temp / path.name)
        write_text_atomic(temp / CONFIG_FILE, text)
    return FixResult(key, before, after, sorted(maps), out, changed)


def repaired_exclusions(
    ckpt: Checkpoint, method: QuantMethod, qcfg: QuantizationConfig, target_layers: int
) -> list[str]:
    """The exclusion list under which vLLM builds every linear as the checkpoint stores it."""
    names = draft_linear_names(ckpt.flat_config, target_layers)
    entries = method.rewrite(method.exclusions(qcfg), list(names))
    stored_quantized = [n for n, sources in names.items() if _stored_quantized(ckpt, sources)]
    entries = [e for e in entries if not any(_hits(method, n, e) for n in stored_quantized)]
    for fate in _fates(method, qcfg, entries, names):
        if fate.quantized and not _stored_quantized(ckpt, fate.checkpoint_names):
            entry = method.entry_for(fate.vllm_name)
            if entry not in entries:
                entries.append(entry)
    for fate in _fates(method, qcfg, entries, names):
        stored = _stored_quantized(ckpt, fate.checkpoint_names)
        if fate.scheme == "error" or fate.quantized != stored:
            built = "an error" if fate.scheme == "error" else fate.scheme
            raise InputError(
                f"{ckpt.folder / CONFIG_FILE}: no {'.'.join(method.exclusion_path(qcfg))} makes "
                f"vLLM build {fate.vllm_name} as stored ({'quantized' if stored else 'BF16'}; "
                f"it would be {built}: {fate.reason}); re-export the draft"
            )
    return entries


def _fates(
    method: QuantMethod,
    qcfg: QuantizationConfig,
    entries: list[str],
    names: dict[str, tuple[str, ...]],
) -> list[LayerFate]:
    candidate = method.with_exclusions(qcfg, entries)
    return [method.fate(n, sources, candidate) for n, sources in names.items()]


def _hits(method: QuantMethod, name: str, entry: str) -> bool:
    try:
        return method.excluded(name, [entry])
    except ValueError:
        return True


def _stored_quantized(ckpt: Checkpoint, sources: tuple[str, ...]) -> bool:
    return any(
        (w := ckpt.tensors.get(f"{s}.weight")) is not None and w.dtype not in FLOAT_DTYPES
        for s in sources
    )


def _require_list(src: Path, method: QuantMethod, qcfg: QuantizationConfig, key: str) -> None:
    node: object = qcfg
    for part in method.exclusion_path(qcfg):
        node = node.get(part, []) if isinstance(node, dict) else None
    if not isinstance(node, list):
        raise InputError(
            f"{src / CONFIG_FILE}: quantization_config.{key} is {type(node).__name__}, not a "
            f"list; write it as a list of module names"
        )


def _restored_maps(ckpt: Checkpoint, source: Path) -> dict[str, TensorBlob]:
    """The source draft's ``d2t``/``t2d`` for each map the draft holds cast, checked to be the
    maps the draft was made from."""
    origin = read_checkpoint(source)
    cast = [name for name in MAPS if is_cast(ckpt, name)]
    if not cast:
        raise InputError(
            f"{ckpt.folder}: d2t and t2d are stored as vLLM reads them (integer, boolean); "
            "nothing to restore, drop --d2t-from"
        )
    blobs = {}
    for name in cast:
        if name not in origin.tensors or is_cast(origin, name):
            raise InputError(
                f"{source}: holds no {'integer' if name == 'd2t' else 'boolean'} '{name}'; "
                "pass the BF16 draft the quantized one was made from"
            )
        mine, theirs = ckpt.tensors[name], origin.tensors[name]
        if mine.shape != theirs.shape:
            raise InputError(
                f"{source}: '{name}' has shape {list(theirs.shape)}, the draft's "
                f"{list(mine.shape)}; pass the BF16 draft the quantized one was made from"
            )
        stored = read_floats(ckpt, name)
        wrong = sum(
            cast_to(v, mine.dtype) != s
            for v, s in zip(read_ints(origin, name), stored, strict=True)
        )
        if wrong:
            raise InputError(
                f"{source}: its '{name}' cast to {mine.dtype} differs from the draft's in {wrong} "
                f"of {len(stored)} entries; pass the BF16 draft the quantized one was made from"
            )
        blobs[mine.name] = blob_from_file(theirs, mine.name)
    return blobs


def _write_maps(ckpt: Checkpoint, maps: dict[str, TensorBlob], folder: Path) -> set[str]:
    """Write each shard holding a restored map into ``folder`` (a sibling renamed into place),
    with the index's total size; return the file names written."""
    if not maps:
        return set()
    files = {info.file for info in ckpt.tensors.values() if info.name in maps}
    written = set()
    for path in sorted(files):
        header = read_header(path)
        blobs = [maps.get(name) or blob_from_file(info) for name, info in header.tensors.items()]
        temp = folder / f".{path.name}.fix-config-tmp"
        try:
            write_safetensors(temp, blobs)
            os.replace(temp, folder / path.name)
        finally:
            temp.unlink(missing_ok=True)
        written.add(path.name)
    if ckpt.sharded:
        written.add(_write_index(ckpt, maps, folder))
    return written


def _write_index(ckpt: Checkpoint, maps: dict[str, TensorBlob], folder: Path) -> str:
    index = json.loads((ckpt.folder / INDEX_FILE).read_text())
    metadata = index.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("total_size"), int):
        grown = sum(
            blob.nbytes - info.nbytes
            for info in ckpt.tensors.values()
            if (blob := maps.get(info.name)) is not None
        )
        metadata["total_size"] += grown
    write_text_atomic(folder / INDEX_FILE, json.dumps(index, indent=2) + "\n")
    return INDEX_FILE


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
        os.chmod(dst, FILE_MODE)
