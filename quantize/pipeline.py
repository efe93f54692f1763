"""The heavy stages of the export (torch and Quark imported here, never at CLI start-up).

Each stage takes what it uses; the orchestrator (:mod:`eaglequant.quantize.export`)
passes it along and owns the order.
"""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
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
from eaglequant.model import compute
from eaglequant.model.eagle3 import Eagle3Draft
from eaglequant.model.load import load_draft_module, load_reference_layer
from eaglequant.quantize import quark_backend
from eaglequant.quantize.file_to_file import FileToFile, quark_write_error
from eaglequant.quantize.measure import Measurement, measure
from eaglequant.quantize.sources import CalibrationSource
from eaglequant.recipe import CalibrationSpec, Recipe
from eaglequant.results.manifest import DeviceRecord
from eaglequant.rules.draft import FIRST_LAYER, DraftDims, dims_from_config


@dataclass
class Calibration:
    """Calibration and held-out draft batches (None: no calibration data, fixed ranges)."""

    batches: list[dict[str, torch.Tensor]] | None
    held_out: list[dict[str, torch.Tensor]]
    sequences: int
    tokens: int
    capture: CaptureInfo | None = None  # capture.json of the captured states


NO_CALIBRATION = Calibration(None, [], 0, 0)


def resolve_device(asked: str) -> torch.device:
    """``auto``: the accelerator torch sees (CUDA or ROCm), else the CPU; ``cuda`` must exist."""
    available = torch.cuda.is_available()
    if asked == "cuda" and not available:
        raise InputError(
            "device 'cuda': torch sees no CUDA or ROCm device here; use device cpu or auto"
        )
    return torch.device("cuda" if asked == "cuda" or (asked == "auto" and available) else "cpu")


def describe_device(device: torch.device) -> DeviceRecord:
    """The manifest's record of where the export's arithmetic ran."""
    if device.type == "cuda":
        hip = getattr(torch.version, "hip", None)
        name = torch.cuda.get_device_name(device)
        return {"type": "cuda", "name": name, "runtime": f"rocm {hip}" if hip else "cuda"}
    return {
        "type": "cpu",
        "threads": torch.get_num_threads(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "gemm": compute.paths_taken(),  # how fc and lm_head computed: bf16 and/or float32
    }


def load(ckpt: Checkpoint, *, module_needed: bool, device: torch.device) -> Eagle3Draft | None:
    """The draft as a torch module on ``device``, when calibration, Quark or measurement needs it.

    The file-to-file flow without calibration data never holds the whole draft.
    """
    torch.set_grad_enabled(False)
    if not module_needed:
        return None
    # fc, lm_head and embed_tokens are checked for NaN/Inf as the output is read back.
    model = load_draft_module(ckpt, check_unquantized=False)
    if device.type != "cpu":
        torch.nn.Module.to(model, device)  # in place; PreTrainedModel.to is typed for dtypes only
    return model


def calibrate(
    model: Eagle3Draft | None,
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
    if model is None or source.kind == "none":
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


def quantize(
    ckpt: Checkpoint,
    model: Eagle3Draft | None,
    recipe: Recipe,
    batches: list[dict[str, torch.Tensor]] | None,
    *,
    file_to_file: FileToFile | None,
    scratch_parent: Path,
    out: Path,
) -> quark_backend.QuarkResult:
    """Quark: the file-to-file flow already under way for dynamic activations, else the
    calibrated static flow.

    The static flow writes into a scratch folder under ``scratch_parent``; ``out``
    names the export's output in an I/O error.
    """
    if file_to_file is not None:
        return quark_backend.quantize_file_to_file(file_to_file)

    assert model is not None
    with quark_backend.scratch_dir(scratch_parent) as scratch:
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


def measure_export(
    ckpt: Checkpoint,
    model: Eagle3Draft | None,
    tensors: dict[str, torch.Tensor],
    recipe: Recipe,
    held_out: list[dict[str, torch.Tensor]],
) -> Measurement:
    def weight_of(name: str) -> torch.Tensor:
        if model is not None:
            return model.linear_weight(name)
        return ckpt.load_tensor(f"{name}.weight")

    linears = dims_from_config(ckpt.flat_config).linears
    return measure(model, tensors, recipe, held_out, weight_of, linears)
