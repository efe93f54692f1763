"""``eaglequant export``: the orchestrator, one checklist from BF16 draft to FP8 folder.

check (no heavy imports) -> start: Quark's worker for the dynamic recipes (it imports
Quark on its own core from here on) and the output folder (pass-through copy, NaN/Inf
check, read-back and fsync in the background) -> import torch (with transformers only
where a stage holds the draft as a module) -> load -> calibrate -> quantize with Quark
-> measure (without the module: beside the next two) -> write (config with regex
exclusions, shards, index) -> verify by reading back -> manifest. Everything is written
into a temporary sibling of the output folder and renamed into place only when the
read-back checks pass. A failure of the background copy (a NaN in ``lm_head``) is
reported at the next stage boundary.

The stage report (the manifest's ``timings_s``) covers the process from its
start: the plain names are this process's stages one after the other and add
up to ``total`` (the wall time up to the manifest; only the rename and the exit
come after it); ``stage.part`` names are parts of a stage; ``background.*`` ran
beside them (the copy thread, Quark's worker, the measurement, the last fsync).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from eaglequant.capture.run import check_engine
from eaglequant.capture.sequences import check_data
from eaglequant.errors import InputError
from eaglequant.interpreter import collection_paused
from eaglequant.io.checkpoint import Checkpoint, read_checkpoint
from eaglequant.io.model_config import QuantizationConfig, QuarkExport, StoredConfig
from eaglequant.io.output import atomic_output_dir, check_output_path
from eaglequant.io.speculators import with_quantization_config
from eaglequant.progress import Progress
from eaglequant.quantize.artifact import Artifact
from eaglequant.quantize.file_to_file import FileToFile
from eaglequant.quantize.sources import CalibrationSource
from eaglequant.quantize.timing import InThread, timed
from eaglequant.recipe import Recipe
from eaglequant.results.manifest import CalibrationRecord, LayerRecord, Manifest, build_manifest
from eaglequant.rules.draft import (
    DraftDims,
    form_exclude,
    kv_scale_name,
    require_bf16_draft,
)
from eaglequant.rules.exclusions import rewrite_exclude
from eaglequant.rules.target_fit import check_target_fits

if TYPE_CHECKING:  # torch: imported by the import stage, beside Quark's worker
    from eaglequant.quantize.quark_backend import QuarkResult


@dataclass(frozen=True, kw_only=True)
class ExportRequest:
    src: Path
    out: Path
    recipe: Recipe
    calibration: CalibrationSource
    max_shard_size: int
    overwrite: bool = False
    dry_run: bool = False
    device: str = "auto"  # the export's arithmetic (Quark, measurement): auto, cpu or cuda
    command: str | None = None  # how it was invoked, path-free (eaglequant.results.provenance)


@dataclass
class ExportPlan:
    """What the checks established before any heavy work."""

    ckpt: Checkpoint
    dims: DraftDims
    aux_layer_ids: tuple[int, ...] | None
    module_needed: bool
    steps: list[str]
    recipe: Recipe  # the request's, its exclude extended by what this form keeps BF16


@dataclass
class ExportResult:
    out: Path
    plan: ExportPlan
    dry_run: bool = False
    manifest: Manifest | None = None  # None for a dry run


def plan_export(request: ExportRequest) -> ExportPlan:
    """Check input, recipe, calibration source and output; import nothing heavy."""
    ckpt = read_checkpoint(request.src)
    dims = require_bf16_draft(ckpt)
    if request.recipe.kv_cache.scaled and not any(map(kv_scale_name, dims.linears)):
        raise InputError(
            f"recipe {request.recipe.name}: 'kv_cache.dtype: {request.recipe.kv_cache.dtype}' "
            f"calibrates the outputs of k_proj and v_proj, which this {dims.form.family} draft "
            "lacks; use a recipe without kv_cache"
        )
    check_output_path(request.out, [request.src], request.overwrite)
    calib = request.calibration
    if request.recipe.calibration.fixed and calib.kind != "none":
        raise InputError(
            f"recipe {request.recipe.name}: calibration-free ('calibration.fixed: true', input "
            f"scales from fixed_input_amax {request.recipe.calibration.fixed_input_amax}); "
            "drop the calibration inputs or pick a calibrated recipe"
        )
    recipe = replace(request.recipe, exclude=form_exclude(request.recipe.exclude, dims))
    aux_ids = dims.aux_layer_ids
    if calib.kind == "target":
        assert calib.target is not None and calib.data is not None
        aux_ids = check_target_fits(calib.target, dims)
        check_data(calib.data)
        if calib.engine is not None:
            check_engine(calib.engine)
    elif calib.kind == "capture":
        assert calib.capture is not None
        if not calib.capture.exists():
            raise InputError(f"{calib.capture}: no such capture folder; run `eaglequant capture`")
    flow = "direct_quantize_checkpoint" if recipe.direct_flow else "quantize_model"
    steps = [
        f"load {request.src} ({len(ckpt.tensors)} tensors, {ckpt.total_bytes} bytes)",
        f"calibrate: {calib.describe()}",
        f"quantize with Quark {flow}, recipe {recipe.name}",
        f"write {request.out} with exclude {rewrite_exclude(list(recipe.exclude))}",
        "verify the written folder by reading it back",
    ]
    module_needed = not recipe.direct_flow or calib.kind != "none"
    return ExportPlan(ckpt, dims, aux_ids, module_needed, steps, recipe)


def export_draft(
    request: ExportRequest, progress: Progress = lambda _msg: None, *, started: float | None = None
) -> ExportResult:
    """Run the whole export; see the module docstring for the steps.

    ``started``: when the process started (:func:`~eaglequant.quantize.timing.process_started`,
    the CLI passes it); the stage report then begins with the start-up before this call.
    """
    timings: dict[str, float] = {}
    if started is not None:
        timings["startup"] = round(time.perf_counter() - started, 3)
    began = started if started is not None else time.perf_counter()
    stage = _Stages(timings, progress)
    with timed(timings, "plan"):  # quiet: an error here is the only line printed
        plan = plan_export(request)
    request = replace(request, recipe=plan.recipe)
    if request.dry_run:
        return ExportResult(request.out, plan, dry_run=True)
    with atomic_output_dir(request.out, request.overwrite) as temp:
        artifact, file_to_file = None, None
        try:
            with timed(timings, "start"):
                file_to_file = _start_quark(request, plan, temp.parent)
                artifact = Artifact.start(temp, plan.ckpt, request.recipe, request.max_shard_size)
            stage.before_each = artifact.raise_if_failed
            manifest = _run(request, plan, artifact, file_to_file, stage, progress, temp.parent)
            timings["total"] = round(time.perf_counter() - began, 3)
            artifact.write_manifest(manifest)
        finally:
            if artifact is not None:
                artifact.cancel()
            if file_to_file is not None:
                file_to_file.close()
    return ExportResult(request.out, plan, manifest=manifest)


def _start_quark(request: ExportRequest, plan: ExportPlan, scratch: Path) -> FileToFile | None:
    """Quark's direct flow: its worker, importing Quark from now on (the module flow: None)."""
    if not request.recipe.direct_flow:
        return None
    return FileToFile(plan.ckpt, request.recipe, scratch, request.out)


def _run(
    request: ExportRequest,
    plan: ExportPlan,
    artifact: Artifact,
    file_to_file: FileToFile | None,
    stage: _Stages,
    progress: Progress,
    scratch: Path,
) -> Manifest:
    """The stages after the start, up to the manifest (returned, not yet written)."""
    recipe, timings = request.recipe, stage.timings
    with stage("import"), collection_paused():
        # lazy: torch-free core
        from eaglequant.quantize import pipeline  # torch and co., beside Quark's import

        if plan.module_needed:
            # lazy: torch-free core
            from eaglequant.quantize import module_flow  # transformers: the draft as a module
    with stage("load"):
        device = pipeline.resolve_device(request.device)
        model = module_flow.load(plan.ckpt, device) if plan.module_needed else None
    with stage("calibrate"):
        calib = pipeline.NO_CALIBRATION
        if model is not None:
            calib = module_flow.calibrate(
                model,
                request.calibration,
                recipe.calibration,
                plan.dims,
                plan.aux_layer_ids,
                scratch_parent=scratch,
                progress=progress,
            )
    with stage("quantize"):
        if file_to_file is not None:
            quark = pipeline.quantize_file_to_file(file_to_file)
            file_to_file.close()  # its scratch folder goes now, not after the manifest
        else:
            assert model is not None  # every static recipe needs the module (plan_export)
            quark = module_flow.quantize_static(
                plan.ckpt, model, recipe, calib.batches, scratch_parent=scratch, out=request.out
            )
    write = partial(_write_and_verify, stage, artifact, plan.ckpt, quark, recipe)
    if model is not None:  # held-out steps through both drafts: alone, before the read-back
        with stage("measure"):
            measurement = pipeline.measure_export(
                plan.ckpt, model, quark.tensors, recipe, calib.held_out
            )
        del model
        files = write()
    else:  # one BF16 weight at a time, beside the write and the read-back (its stage: the wait)
        measuring = InThread(
            partial(
                pipeline.measure_export, plan.ckpt, model, quark.tensors, recipe, calib.held_out
            ),
            timings,
            "background.measure",
        )
        try:
            files = write()
            with stage("measure"):
                measurement = measuring.result()
        finally:
            measuring.wait()  # never left running past a failed write
    with stage("manifest"):
        timings.update({f"quantize.{name}": value for name, value in quark.timings.items()})
        timings["background.copy"] = round(artifact.writer.background_s, 3)
        timings.update(artifact.timings)
        if file_to_file is not None:
            for name in ("quark_import", "stage_midlayer"):
                timings[f"background.{name}"] = file_to_file.timings[name]
        return build_manifest(
            source=request.src,
            recipe=recipe.to_dict(),
            calibration=_calibration_record(request, plan, calib, measurement),
            layers=[cast(LayerRecord, asdict(layer)) for layer in measurement.layers],
            top1_agreement=measurement.top1_agreement,
            timings=timings,
            files=files,
            device=pipeline.describe_device(device),
            command=request.command,
        )


class _Stages:
    """Times each stage into ``timings``, reports it through ``progress``, runs ``before_each``."""

    def __init__(self, timings: dict[str, float], progress: Progress) -> None:
        self.timings, self.progress = timings, progress
        self.before_each: Callable[[], None] = lambda: None

    def __call__(self, name: str) -> _Stage:
        return _Stage(self, name)


class _Stage:
    def __init__(self, owner: _Stages, name: str) -> None:
        self.owner, self.name = owner, name

    def __enter__(self) -> None:
        self.owner.before_each()
        self.owner.progress(f"{self.name} ...")
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self.started
        self.owner.timings[self.name] = round(elapsed, 3)
        if exc[0] is None:
            self.owner.progress(f"{self.name} done in {elapsed:.1f}s")


def _write_and_verify(
    stage: _Stages, artifact: Artifact, ckpt: Checkpoint, quark: QuarkResult, recipe: Recipe
) -> dict[str, str]:
    """Quark's tensors into their places, then the folder read back: every file's sha256."""
    with stage("write"):
        config = output_config(ckpt.stored_config, quark.quantization_config, recipe)
        artifact.finish(quark.tensors, config)
    with stage("verify"):
        return artifact.verify()


def output_config(
    source: StoredConfig, quark_qcfg: QuantizationConfig, recipe: Recipe
) -> StoredConfig:
    """The input config plus Quark's quantization_config (top level), exclusions as regex."""
    qcfg: QuantizationConfig = {**quark_qcfg}
    qcfg["exclude"] = rewrite_exclude(list(recipe.exclude))
    export: QuarkExport = {**(qcfg.get("export") or {})}
    if not isinstance(export.get("kv_cache_group"), list):
        export["kv_cache_group"] = []
    qcfg["export"] = export
    return with_quantization_config(source, qcfg)


def _calibration_record(
    request: ExportRequest, plan: ExportPlan, calib: Any, measurement: Any
) -> CalibrationRecord:
    """The manifest's ``calibration``: where inputs came from and how many were used."""
    source, recipe = request.calibration, request.recipe
    return {
        "source": source.describe(),
        "kind": source.kind,
        "calibrated": source.kind != "none" or not recipe.needs_calibration,
        "sequences": calib.sequences,
        "tokens": calib.tokens,
        "held_out_tokens": measurement.held_out_tokens,
        "speculative_steps": recipe.calibration.steps,
        "aux_layer_ids": list(plan.aux_layer_ids) if plan.aux_layer_ids else None,
        "capture": _capture_summary(calib.capture),
    }


def _capture_summary(info: dict[str, Any] | None) -> dict[str, Any] | None:
    """Where the calibration states came from: the capture's engine and sizes (no replicas)."""
    if info is None:
        return None
    engine = {k: v for k, v in (info.get("engine") or {}).items() if k != "replicas"}
    keys = ("target", "data", "aux_layer_ids", "sequences", "seq_len", "tokens", "tokens_per_s")
    return {**{k: info[k] for k in keys if k in info}, "engine": engine}
