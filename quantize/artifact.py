"""The export's output folder, from plan to read-back (light: no torch, no Quark at import).

The layout is planned before Quark runs: Quark's tensors are predicted by name,
dtype and shape, so every pass-through tensor is copied by byte range into its
final place (in the kernel), then read back once (compared with its input,
checked for NaN/Inf, hashed) up to the first pending tensor of its file, and
fsynced, in background threads while torch and Quark are still being imported.
Quark's real tensors are then dropped into their slots (the folder is re-planned
if they differ from the prediction), the config and the source's other files
are written, the read-back is completed while their fsync waits on the disk, and the
manifest goes in last.
:class:`Artifact` holds the one writer throughout; its ``timings`` say where
the writing's time went.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from eaglequant.errors import CheckFailed
from eaglequant.io.checkpoint import CONFIG_FILE, Checkpoint, read_checkpoint
from eaglequant.io.layout import Layout, TensorBlob, blob_from_file, blob_from_tensor, plan_layout
from eaglequant.io.model_config import StoredConfig
from eaglequant.io.readback import ReadBack, sha256_file
from eaglequant.io.safetensors_header import TensorInfo
from eaglequant.io.writer import LayoutWriter, copy_extra_files, write_text
from eaglequant.quantize.timing import InThread, timed
from eaglequant.recipe import MX_BLOCK, MX_DTYPES, Recipe
from eaglequant.results.manifest import MANIFEST_FILE, Manifest, write_manifest
from eaglequant.rules.draft import dims_from_config, structure_problems
from eaglequant.rules.exclusions import DEFAULT_TARGET_LAYERS, predict_fates
from eaglequant.rules.inspection import quantization_problems, read_scales

if TYPE_CHECKING:
    import torch

NOT_COPIED = {CONFIG_FILE, "README.md", MANIFEST_FILE}


def predicted_quantized(ckpt: Checkpoint, recipe: Recipe) -> list[TensorBlob]:
    """The tensors Quark writes for each midlayer linear, by name, dtype and shape.

    :meth:`Artifact.finish` checks Quark's real output against it.
    """
    blobs = []
    for linear in dims_from_config(ckpt.flat_config).linears:
        name = ckpt.stored_name(linear)
        rows, cols = ckpt.tensors[f"{linear}.weight"].shape
        weight_dtype, weight_shape, scale_dtype, scale_shape = quantized_layout(
            recipe, (rows, cols)
        )
        blobs.append(TensorBlob(f"{name}.weight", weight_dtype, weight_shape))
        blobs.append(TensorBlob(f"{name}.weight_scale", scale_dtype, scale_shape))
        if not recipe.activation.dynamic:
            blobs.append(TensorBlob(f"{name}.input_scale", "F32", ()))
    return blobs


def quantized_layout(
    recipe: Recipe, shape: tuple[int, int]
) -> tuple[str, tuple[int, ...], str, tuple[int, ...]]:
    """(weight dtype, weight shape, scale dtype, scale shape) on disk for one linear.

    OCP MX: one E8M0 exponent byte per 32 input elements; MXFP4 packs two values a byte.
    """
    rows, cols = shape
    dtype = recipe.weight.dtype
    if dtype in MX_DTYPES:
        weight = ("U8", (rows, cols // 2)) if dtype == "mxfp4" else ("F8_E4M3", (rows, cols))
        return (*weight, "U8", (rows, cols // MX_BLOCK))
    per_channel = recipe.weight.granularity == "per_channel"
    return "F8_E4M3", (rows, cols), "F32", ((rows,) if per_channel else ())


def passthrough_blobs(ckpt: Checkpoint) -> list[TensorBlob]:
    replaced = {f"{name}.weight" for name in dims_from_config(ckpt.flat_config).linears}
    return [blob_from_file(info) for name, info in ckpt.tensors.items() if name not in replaced]


class Artifact:
    """One output folder being written: its layout, its writer, what went in, its checksums."""

    def __init__(self, folder: Path, source: Checkpoint, layout: Layout, max_shard_size: int):
        self.folder, self.source, self.max_shard_size = folder, source, max_shard_size
        self.writer = LayoutWriter(folder, layout, after_known=self._settle_known)
        self.readback = ReadBack(folder, layout, check_chunk=_check_finite)
        self.timings: dict[str, float] = {}
        self.quantized: dict[str, bytes] = {}
        self.files: list[str] = []
        self._final_sync: InThread | None = None

    @classmethod
    def start(
        cls, folder: Path, source: Checkpoint, recipe: Recipe, max_shard_size: int
    ) -> Artifact:
        """Plan the output with Quark's tensors still pending and copy everything else now."""
        blobs = passthrough_blobs(source) + predicted_quantized(source, recipe)
        artifact = cls(folder, source, plan_layout(blobs, max_shard_size), max_shard_size)
        artifact.writer.start_background()
        return artifact

    @property
    def layout(self) -> Layout:
        return self.writer.layout

    def raise_if_failed(self) -> None:
        """Report a failure of the background copy (a NaN in lm_head, a short read) now."""
        self.writer.raise_if_failed()

    def cancel(self) -> None:
        self.writer.cancel()
        if self._final_sync is not None:
            self._final_sync.wait()

    def _settle_known(self) -> None:
        """In the writer's thread, once the known bytes are in: read them back while another
        thread fsyncs them (the read-back works the CPU, the fsync waits on the disk).

        One reading thread: the other core is Quark's, still importing.
        """
        syncing = InThread(self.writer.sync, self.timings, "background.fsync")
        try:
            with timed(self.timings, "background.readback"):
                self.readback.advance(stop=self.writer.cancelled)
        finally:
            syncing.wait()
        syncing.raise_error()  # in the writer's thread, re-raised by the export's next stage

    def finish(self, quantized: dict[str, torch.Tensor], config: StoredConfig) -> None:
        """Drop Quark's tensors into their planned places (re-plan if Quark wrote others).

        ``quantized`` is named in the EAGLE-3 layout; the folder keeps the input's format.
        """
        stored = {self.source.stored_name(name): tensor for name, tensor in quantized.items()}
        blobs = {name: blob_from_tensor(name, tensor) for name, tensor in stored.items()}
        with timed(self.timings, "write.wait_background"):
            self.writer.wait()  # every pass-through copy, its checks, read-back and fsync
        pending = [p.blob for f in self.layout.files for p in f.placements if p.blob.pending]
        if _signature(pending) == _signature(list(blobs.values())):
            data = {name: blob.data for name, blob in blobs.items()}
            self.writer.finish(data, durable=False)  # type: ignore[arg-type]
        else:
            self._replan(list(blobs.values()))
        # the fsync waits on the disk while verify's read-back works the CPU
        self._final_sync = InThread(self.writer.sync, self.timings, "background.final_fsync")
        write_text(self.folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        extra = copy_extra_files(self.source.folder, self.folder, NOT_COPIED)
        self.files = self.layout.file_names + extra
        self.quantized = {name: b.data for name, b in blobs.items() if b.data is not None}

    def _replan(self, quantized: list[TensorBlob]) -> None:
        for shard in self.layout.files:
            (self.folder / shard.name).unlink()
        layout = plan_layout(passthrough_blobs(self.source) + quantized, self.max_shard_size)
        self.writer = LayoutWriter(self.folder, layout)
        self.readback = ReadBack(self.folder, layout, check_chunk=_check_finite)
        self.writer.write_known()
        self.writer.finish({}, durable=False)

    def verify(self) -> dict[str, str]:
        """Re-open the folder: the inspect checks, then every byte read back and hashed.

        Returns the sha256 of every file written (for the manifest); CheckFailed
        when vLLM would misread the folder.
        """
        reopened = read_checkpoint(self.folder)
        fates = predict_fates(reopened.flat_config)
        problems = [str(p) for p in structure_problems(reopened)]
        scales = read_scales(reopened)
        found = quantization_problems(reopened, fates, scales, DEFAULT_TARGET_LAYERS)
        problems += [str(p) for p in found]
        linears = dims_from_config(self.source.flat_config).linears  # quantized; the rest BF16
        for fate in fates:
            if fate.quantized != any(n in linears for n in fate.checkpoint_names):
                problems.append(f"vLLM would build {fate.vllm_name} as {fate.scheme}")
        digests, byte_problems = self.readback.finish(self.quantized)
        problems += byte_problems
        if self._final_sync is not None:
            with timed(self.timings, "verify.wait_fsync"):
                self._final_sync.result()
        replaced = {f"{n}.weight" for n in linears}
        kept = {info.name for name, info in self.source.tensors.items() if name not in replaced}
        if {info.name for info in reopened.tensors.values()} != kept | set(self.quantized):
            problems.append("the written tensor names differ from input + quantized tensors")
        form = (self.source.speculators_format, self.source.layer_prefix)
        if (reopened.speculators_format, reopened.layer_prefix) != form:
            problems.append("the written config changed the draft's format")
        if problems:
            raise CheckFailed(
                f"{self.folder}: the written output would be misread by vLLM: {problems[0]}"
                + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            )
        return {
            name: digests.get(name) or sha256_file(self.folder / name)
            for name in sorted([*self.files, CONFIG_FILE])
        }

    def write_manifest(self, manifest: Manifest) -> None:
        write_manifest(self.folder, manifest)


def _signature(blobs: list[TensorBlob]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {blob.name: (blob.dtype, blob.shape) for blob in blobs}


def _check_finite(info: TensorInfo, chunk: memoryview) -> None:
    # lazy: torch-free core
    from eaglequant.model.finite import check_finite_chunk  # numpy, never torch

    check_finite_chunk(info, chunk)
