"""``eaglequant capture``: save a target's token ids and auxiliary hidden states for export.

Lets the target run where it fits (a GPU node) and the export run elsewhere.
The folder format is described in ``eaglequant.quantize.calibrate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eaglequant.quantize.calibrate import default_aux_layers, run_target, save_capture

from eaglequant.checkpoint import read_checkpoint, read_config
from eaglequant.draft import require_bf16_draft
from eaglequant.errors import InputError
from eaglequant.output import atomic_output_dir, check_output_path


def capture_hidden_states(
    target: Path,
    data: Path,
    out: Path,
    draft: Path | None,
    aux_layers: str | None,
    samples: int,
    seq_len: int,
    embeddings: bool,
    overwrite: bool,
    trust_remote_code: bool,
) -> dict[str, Any]:
    """Check everything, run the target, write ``out`` atomically; return capture.json's data."""
    from eaglequant.quantize.calibrate import check_target_fits

    check_output_path(out, [target], overwrite)
    if draft is not None:
        dims = require_bf16_draft(read_checkpoint(draft))
        ids = check_target_fits(target, dims)
    else:
        config = read_config(target)
        config = config.get("text_config", config)
        ids = default_aux_layers(int(config.get("num_hidden_layers", 0)))
        dims = None
    if aux_layers:
        ids = _parse_layers(aux_layers)
    if not data.is_file():
        raise InputError(f"{data}: no such calibration data file")
    captured = run_target(target, data, ids, seq_len, samples, trust_remote_code, embeddings)
    target_config = read_config(target)
    info = {
        "target": str(target),
        "data": str(data),
        "aux_layer_ids": list(ids),
        "target_hidden_size": target_config.get("hidden_size"),
        "vocab_size": target_config.get("vocab_size"),
        "sequences": len(captured.input_ids),
        "seq_len": int(captured.input_ids.shape[1]),
        "draft_checked": dims is not None,
    }
    with atomic_output_dir(out, overwrite) as temp:
        save_capture(temp, captured, info)
    return info


def _parse_layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError as exc:
        raise InputError(
            f"--aux-layers {text!r}: give comma-separated integers, e.g. 1,2,3"
        ) from exc
