"""The export's stages that both flows share (torch imported here, never at CLI start-up).

The module flow (:mod:`.module_flow`: the draft held as a torch module, for
calibration, Quark's static flow or the held-out measurement) adds transformers
and is imported only where the export needs it; the file-to-file flow without
calibration data runs on these stages alone, so its process spends its cores on
the copy beside Quark's worker instead of on importing transformers.

Each stage takes what it uses; the orchestrator (:mod:`eaglequant.quantize.export`)
passes it along and owns the order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eaglequant.capture.records import CaptureInfo
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import Checkpoint
from eaglequant.model import compute
from eaglequant.quantize import quark_backend
from eaglequant.quantize.file_to_file import FileToFile
from eaglequant.quantize.measure import Measurement, measure
from eaglequant.recipe import Recipe
from eaglequant.results.manifest import DeviceRecord
from eaglequant.rules.draft import dims_from_config

if TYPE_CHECKING:  # transformers comes with the module flow
    from eaglequant.model.eagle3 import Eagle3Draft


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


def quantize_file_to_file(file_to_file: FileToFile) -> quark_backend.QuarkResult:
    """Quark's file-to-file flow, under way since the export started (dynamic activations)."""
    return quark_backend.quantize_file_to_file(file_to_file)


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
