"""The export's stages that hold the draft as a torch module (transformers imported here).

Loading the draft, collecting calibration and held-out inputs (from a capture or
a target run through the capture path), and Quark's calibrated static flow. The
export imports this module only where a stage needs the module: every static
recipe, and a dynamic one given calibration data for its held-out measurement.
"""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn

from eaglequant.capture.records import CaptureInfo
from eaglequant.capture.run import capture_into
from eaglequant.capture.sequences import tokenize_data
from eaglequant.capture.store import CalibrationData, load_capture, read_info
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import Checkpoint
from eaglequant.model.eagle3 import Eagle3Draft
from eaglequant.model.load import load_draft_module, load_reference_layer
from eaglequant.quantize import quark_backend
from eaglequant.quantize.file_to_file import layer_weight_bytes, quark_write_error
from eaglequant.quantize.pipeline import NO_CALIBRATION, Calibration
from eaglequant.quantize.sources import CalibrationSource
from eaglequant.recipe import CalibrationSpec, Recipe
from eaglequant.rules.draft import FIRST_LAYER, DraftDims


def load(ckpt: Checkpoint, device: torch.device) -> Eagle3Draft:
    """The draft as a torch module on ``device``, for calibration, Quark or measurement."""
    torch.set_grad_enabled(False)
    # fc, lm_head and embed_tokens are checked for NaN/Inf as the output is read back.
    model = load_draft_module(ckpt, check_unquantized=False)
    if device.type != "cpu":
        torch.nn.Module.to(model, device)  # in place; PreTrainedModel.to is typed for dtypes only
    return model


def calibrate(
    model: Eagle3Draft,
    source: CalibrationSource,
    spec: CalibrationSpec,
    dims: DraftDims,
    aux_layer_ids: tuple[int, ...] | None,
    *,
    scratch_parent: Path,
    progress: Callable[[str], None],
) -> Calibration:
    """Collect draft inputs from ``source`` and split off the held-out part.

    A target is run through the capture path (the chosen engine) into a scratch
    folder under ``scratch_parent`` and read back like any capture.
    """
    if source.kind == "none":
        return NO_CALIBRATION
    samples = source.samples or spec.samples
    info: CaptureInfo | None
    if source.kind == "target":
        assert source.target and source.data and aux_layer_ids and source.engine
        with tempfile.TemporaryDirectory(prefix=".calibration-", dir=scratch_parent) as scratch:
            tokenized = tokenize_data(
                source.target,
                source.data,
                source.seq_len or spec.seq_len,
                samples + spec.held_out,
                source.engine.trust_remote_code,
            )
            info = capture_into(
                Path(scratch),
                target=source.target,
                sequences=tokenized.sequences,
                aux_ids=aux_layer_ids,
                engine=source.engine,
                embeddings=model.embed_tokens is None,
                source={"data": tokenized.provenance},
                progress=progress,
            )
            data = load_capture(Path(scratch), dims)
    else:
        assert source.capture
        data = load_capture(source.capture, dims)
        info = read_info(source.capture)
    if model.embed_tokens is None:
        _attach_embeddings(model, data)
    calib, held = data.split(samples, spec.held_out)
    device = next(model.parameters()).device
    batches = _on(device, calib.batches(spec.batch_size))
    held_out = _on(device, held.batches(spec.batch_size))
    return Calibration(batches, held_out, len(calib.input_ids), calib.tokens, info)


def _on(
    device: torch.device, batches: list[dict[str, torch.Tensor]]
) -> list[dict[str, torch.Tensor]]:
    if device.type == "cpu":
        return batches
    return [{k: v.to(device) for k, v in batch.items()} for batch in batches]


def _attach_embeddings(model: Eagle3Draft, data: CalibrationData) -> None:
    if data.embed_tokens is None:
        raise InputError(
            f"{data.source}: the draft has no embed_tokens and this calibration source holds "
            "none; re-run `eaglequant capture` with --embeddings"
        )
    device = next(model.parameters()).device
    model.embed_tokens = nn.Embedding.from_pretrained(data.embed_tokens.to(device), freeze=True)


def quantize_static(
    ckpt: Checkpoint,
    model: Eagle3Draft,
    recipe: Recipe,
    batches: list[dict[str, torch.Tensor]] | None,
    *,
    scratch_parent: Path,
    out: Path,
) -> quark_backend.QuarkResult:
    """Quark's calibrated static flow on ``model``, which then holds the stored decoder
    layers again, as the reference the measurement needs.

    Quark writes into a scratch folder (in shared memory where there is room, else under
    ``scratch_parent``); ``out`` names the export's output in an I/O error.
    """
    with quark_backend.scratch_dir(scratch_parent, layer_weight_bytes(ckpt)) as scratch:
        try:
            model.unroll_steps = recipe.calibration.steps
            result = quark_backend.quantize_static(model, recipe, batches, Path(scratch))
        except SafetensorError as exc:  # Quark's own writing into the scratch folder
            raise quark_write_error(out, scratch, str(exc)) from exc
    # Quark replaced the decoder layers' linears in place; measure against the originals
    # (each freed first: two copies of a layer at once would not fit at full size).
    device = next(model.fc.parameters()).device
    del model.midlayer
    gc.collect()
    model.midlayer = load_reference_layer(ckpt, FIRST_LAYER).to(device)
    for key in list(model.layers):
        del model.layers[key]
        gc.collect()
        model.layers[key] = load_reference_layer(ckpt, f"layers.{key}").to(device)
    return result
