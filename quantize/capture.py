"""``eaglequant capture``: save a target's token ids and auxiliary hidden states for export.

Lets the target run where it fits (a GPU node) and the export run elsewhere.
The folder format is described in ``eaglequant.quantize.calibrate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglequant.draft import check_target_fits, default_aux_layers, require_bf16_draft
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_checkpoint, read_config
from eaglequant.io.output import atomic_output_dir, check_output_path


@dataclass(frozen=True, kw_only=True)
class CaptureRequest:
    """What to run and where to save it; ``aux_layers`` None: the draft's, else vLLM's."""

    target: Path
    data: Path
    out: Path
    draft: Path | None = None
    aux_layers: tuple[int, ...] | None = None
    samples: int = 72
    seq_len: int = 256
    embeddings: bool = False
    overwrite: bool = False
    trust_remote_code: bool = False


def capture_hidden_states(request: CaptureRequest) -> dict[str, Any]:
    """Check everything, run the target, write ``out`` atomically; return capture.json's data."""
    from eaglequant.quantize.calibrate import run_target, save_capture

    check_output_path(request.out, [request.target], request.overwrite)
    ids = _aux_layers(request)
    if not request.data.is_file():
        raise InputError(f"{request.data}: no such calibration data file")
    captured = run_target(
        request.target,
        request.data,
        ids,
        request.seq_len,
        request.samples,
        request.trust_remote_code,
        request.embeddings,
    )
    target_config = read_config(request.target)
    info = {
        "target": str(request.target),
        "data": str(request.data),
        "aux_layer_ids": list(ids),
        "target_hidden_size": target_config.get("hidden_size"),
        "vocab_size": target_config.get("vocab_size"),
        "sequences": len(captured.input_ids),
        "seq_len": int(captured.input_ids.shape[1]),
        "draft_checked": request.draft is not None,
    }
    with atomic_output_dir(request.out, request.overwrite) as temp:
        save_capture(temp, captured, info)
    return info


def _aux_layers(request: CaptureRequest) -> tuple[int, ...]:
    """The asked layers, else the draft's (checked against the target), else vLLM's default."""
    if request.draft is not None:
        dims = require_bf16_draft(read_checkpoint(request.draft))
        ids = check_target_fits(request.target, dims)
    else:
        config = read_config(request.target)
        config = config.get("text_config", config)
        ids = default_aux_layers(int(config.get("num_hidden_layers", 0)))
    return request.aux_layers or ids
