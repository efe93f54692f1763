"""The export's output layout, planned before Quark runs (light: no torch, no Quark).

Quark's tensors are predicted by name, dtype and shape, so the shards can be
laid out and every pass-through tensor copied into its final place in a
background thread while torch and Quark are still being imported.
"""

from __future__ import annotations

from pathlib import Path

from eaglequant.checkpoint import Checkpoint
from eaglequant.draft import MIDLAYER_LINEARS
from eaglequant.recipe import Recipe
from eaglequant.safetensors_header import TensorInfo
from eaglequant.writer import LayoutWriter, TensorBlob, blob_from_file, plan_layout


def predicted_quantized(ckpt: Checkpoint, recipe: Recipe) -> list[TensorBlob]:
    """The tensors Quark writes for each midlayer linear, by name, dtype and shape.

    ``pipeline.finish_writing`` checks Quark's real output against it.
    """
    blobs = []
    for name in MIDLAYER_LINEARS:
        shape = ckpt.tensors[f"{name}.weight"].shape
        per_channel = recipe.weight.granularity == "per_channel"
        blobs.append(TensorBlob(f"{name}.weight", "F8_E4M3", shape))
        blobs.append(TensorBlob(f"{name}.weight_scale", "F32", (shape[0],) if per_channel else ()))
        if not recipe.activation.dynamic:
            blobs.append(TensorBlob(f"{name}.input_scale", "F32", ()))
    return blobs


def passthrough_blobs(ckpt: Checkpoint) -> list[TensorBlob]:
    replaced = {f"{name}.weight" for name in MIDLAYER_LINEARS}
    return [blob_from_file(info) for name, info in ckpt.tensors.items() if name not in replaced]


def start_writing(
    folder: Path, ckpt: Checkpoint, recipe: Recipe, max_shard_size: int
) -> LayoutWriter:
    """Plan the output with Quark's tensors still pending and copy everything else now."""
    blobs = passthrough_blobs(ckpt) + predicted_quantized(ckpt, recipe)
    writer = LayoutWriter(folder, plan_layout(blobs, max_shard_size), check_source=_check_finite)
    writer.start_background()
    return writer


def _check_finite(info: TensorInfo) -> None:
    from eaglequant.quantize.finite import check_finite  # torch, imported in the writer thread

    check_finite(info)
