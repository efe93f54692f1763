"""``eaglequant fix-config``: repair an exported FP8 draft's exclude list (the article's FAQ 1).

A speculators-format draft's quantization config is written back at the top level,
where vLLM reads it first.

Rewrites ``quantization_config.exclude`` into regexes vLLM matches, either in
place (config.json replaced atomically) or into a new folder whose weights are
hard links (or byte copies) of the originals. A second run changes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from eaglequant.errors import InputError
from eaglequant.exclusions import rewrite_exclude
from eaglequant.io.checkpoint import CONFIG_FILE, read_checkpoint
from eaglequant.io.output import atomic_output_dir, check_output_path, write_text_atomic
from eaglequant.io.speculators import with_quantization_config
from eaglequant.io.writer import FILE_MODE


@dataclass(frozen=True)
class FixResult:
    """What fix-config did: the exclude list before and after, and where it wrote."""

    before: list[str]
    after: list[str]
    written_to: Path
    changed: bool


def fix_config(src: Path, out: Path | None = None, overwrite: bool = False) -> FixResult:
    """Rewrite the exclude list of ``src`` (in place when ``out`` is None)."""
    if out is not None:
        check_output_path(out, [src], overwrite)
    ckpt = read_checkpoint(src)
    qcfg = ckpt.flat_config.get("quantization_config")  # the one vLLM reads, in either format
    if not isinstance(qcfg, dict) or not isinstance(qcfg.get("exclude", []), list):
        raise InputError(
            f"{src / CONFIG_FILE}: no quantization_config with an exclude list; "
            "fix-config repairs exported FP8 drafts only"
        )
    before = [str(e) for e in qcfg.get("exclude") or []]
    after = rewrite_exclude(before)
    config = with_quantization_config(ckpt.stored_config, {**qcfg, "exclude": after})
    changed = config != ckpt.stored_config
    text = json.dumps(config, indent=2) + "\n"
    if out is None:
        if changed:
            write_text_atomic(src / CONFIG_FILE, text)
        return FixResult(before, after, src, changed)
    with atomic_output_dir(out, overwrite) as temp:
        for path in sorted(src.iterdir()):
            if path.is_file() and path.name != CONFIG_FILE:
                _link_or_copy(path, temp / path.name)
        write_text_atomic(temp / CONFIG_FILE, text)
    return FixResult(before, after, out, changed)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
        os.chmod(dst, FILE_MODE)
