"""The heavy stages of the export (torch and Quark imported here, never at CLI start-up)."""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from eaglequant.quantize import quark_backend
from eaglequant.quantize.calibrate import CalibrationData, load_capture, run_target
from eaglequant.quantize.draft_model import Eagle3Draft
from eaglequant.quantize.layout import passthrough_blobs
from eaglequant.quantize.load import load_draft_module, load_reference_midlayer
from eaglequant.quantize.measure import Measurement, measure
from torch import nn

from eaglequant.checkpoint import CONFIG_FILE, Checkpoint, read_checkpoint
from eaglequant.draft import MIDLAYER_LINEARS, structure_problems
from eaglequant.errors import InputError, OutputError
from eaglequant.exclusions import predict_fates
from eaglequant.inspect_draft import quantization_problems, read_scales
from eaglequant.readback import readback
from eaglequant.recipe import Recipe
from eaglequant.writer import (
    Layout,
    LayoutWriter,
    TensorBlob,
    blob_from_tensor,
    copy_extra_files,
    plan_layout,
    write_text,
)

if TYPE_CHECKING:
    from eaglequant.quantize.export import ExportPlan, ExportRequest

NOT_COPIED = {CONFIG_FILE, "README.md", "eaglequant.json"}


@dataclass
class Calibration:
    """Calibration and held-out draft batches, plus the BF16 input ranges they produce."""

    batches: list[dict[str, torch.Tensor]] | None
    held_out: list[dict[str, torch.Tensor]]
    sequences: int
    tokens: int


def load(plan: ExportPlan, request: ExportRequest) -> Eagle3Draft | None:
    """The draft as a torch module, when calibration or measurement needs it.

    The file-to-file flow without calibration data never holds the whole draft.
    """
    torch.set_grad_enabled(False)
    if not request.recipe.needs_calibration and request.calibration.kind == "none":
        return None
    # fc, lm_head and embed_tokens are checked for NaN/Inf by the writer as it copies them.
    return load_draft_module(plan.ckpt, check_unquantized=False)


def calibrate(plan: ExportPlan, request: ExportRequest, model: Eagle3Draft | None) -> Calibration:
    """Collect draft inputs from the chosen source and split off the held-out part."""
    source, spec = request.calibration, request.recipe.calibration
    if model is None:
        return Calibration(None, [], 0, 0)
    data: CalibrationData | None = None
    count = (source.samples or spec.samples) + spec.held_out
    if source.kind == "target":
        assert source.target and source.data and plan.aux_layer_ids
        data = run_target(
            source.target,
            source.data,
            plan.aux_layer_ids,
            source.seq_len or spec.seq_len,
            count,
            source.trust_remote_code,
            with_embeddings=model.embed_tokens is None,
        )
    elif source.kind == "capture":
        assert source.capture
        data = load_capture(source.capture, plan.dims)
    if data is None:
        return Calibration(None, [], 0, 0)
    if model.embed_tokens is None:
        _attach_embeddings(model, data)
    calib, held = data.split(source.samples or spec.samples, spec.held_out)
    batches = calib.batches(spec.batch_size)
    return Calibration(batches, held.batches(spec.batch_size), len(calib.input_ids), calib.tokens)


def _attach_embeddings(model: Eagle3Draft, data: CalibrationData) -> None:
    if data.embed_tokens is None:
        raise InputError(
            f"{data.source}: the draft has no embed_tokens and this calibration source holds "
            "none; re-run `eaglequant capture` with --embeddings"
        )
    model.embed_tokens = nn.Embedding.from_pretrained(data.embed_tokens, freeze=True)


def quantize(
    plan: ExportPlan,
    request: ExportRequest,
    model: Eagle3Draft | None,
    calib: Calibration,
    temp: Path,
) -> quark_backend.QuarkResult:
    """Quark: calibrated static flow, or the file-to-file flow for dynamic activations."""
    from safetensors import SafetensorError

    recipe = request.recipe
    with quark_backend.scratch_dir(temp.parent) as scratch:
        try:
            if not recipe.needs_calibration:
                return quark_backend.quantize_file_to_file(plan.ckpt, recipe, Path(scratch))
            assert model is not None
            model.unroll_steps = recipe.calibration.steps
            result = quark_backend.quantize_static(model, recipe, calib.batches, Path(scratch))
            # Quark replaced the midlayer's linears in place; measure against the original
            # (freed first: two midlayers at once would not fit at full size).
            del model.midlayer
            gc.collect()
            model.midlayer = load_reference_midlayer(plan.ckpt)
            return result
        except SafetensorError as exc:  # Quark's own writing into the scratch folder
            raise OutputError(
                f"{request.out}: I/O error while writing Quark's output in {scratch}: {exc}; "
                "nothing was written and the input is untouched, free space and rerun"
            ) from exc


def measure_export(
    ckpt: Checkpoint,
    model: Eagle3Draft | None,
    quark: quark_backend.QuarkResult,
    recipe: Recipe,
    calib: Calibration,
) -> Measurement:
    def weight_of(name: str) -> torch.Tensor:
        if model is not None:
            return model.get_submodule(name).weight
        return ckpt.load_tensor(f"{name}.weight")

    return measure(model, quark.tensors, recipe, calib.held_out, weight_of)


@dataclass
class Written:
    """What was written: the layout, the bytes of Quark's tensors, and every file name."""

    layout: Layout
    quantized: dict[str, bytes]
    files: list[str]


def finish_writing(
    writer: LayoutWriter,
    ckpt: Checkpoint,
    quantized: dict[str, torch.Tensor],
    config: dict[str, Any],
    max_shard_size: int,
) -> Written:
    """Drop Quark's tensors into their planned places (re-plan if Quark wrote other tensors)."""
    blobs = {name: blob_from_tensor(name, tensor) for name, tensor in quantized.items()}
    writer.wait()  # every pass-through copy and its NaN/Inf check, whichever way this goes
    pending = [p.blob for f in writer.layout.files for p in f.placements if p.blob.pending]
    if _signature(pending) == _signature(list(blobs.values())):
        writer.finish({name: blob.data for name, blob in blobs.items()})  # type: ignore[misc]
    else:
        for shard in writer.layout.files:
            (writer.folder / shard.name).unlink()
        layout = plan_layout(passthrough_blobs(ckpt) + list(blobs.values()), max_shard_size)
        writer = LayoutWriter(writer.folder, layout)
        writer.write_known()
        writer.finish({})
    folder = writer.folder
    write_text(folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    files = writer.layout.file_names + copy_extra_files(ckpt.folder, folder, NOT_COPIED)
    data = {name: blob.data for name, blob in blobs.items() if blob.data is not None}
    return Written(writer.layout, data, files)


def _signature(blobs: list[TensorBlob]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {blob.name: (blob.dtype, blob.shape) for blob in blobs}


def verify(folder: Path, source: Checkpoint, written: Written) -> dict[str, str]:
    """Re-open the written folder: the inspect checks, then every byte read back and hashed.

    Returns the sha256 of every weight file (for the manifest).
    """
    from eaglequant.quantize.export import fail_verification

    reopened = read_checkpoint(folder)
    fates = predict_fates(reopened.config)
    problems = [str(p) for p in structure_problems(reopened)]
    problems += [str(p) for p in quantization_problems(reopened, fates, read_scales(reopened), 32)]
    for fate in fates:
        expect_quantized = fate.vllm_name not in ("model.fc", "lm_head")
        if fate.quantized != expect_quantized:
            problems.append(f"vLLM would build {fate.vllm_name} as {fate.scheme}")
    digests, byte_problems = readback(folder, written.layout, written.quantized)
    problems += byte_problems
    if set(reopened.tensors) != set(source.tensors) - {
        f"{n}.weight" for n in MIDLAYER_LINEARS
    } | set(written.quantized):
        problems.append("the written tensor names differ from input + quantized tensors")
    if problems:
        fail_verification(folder, problems)
    return digests
