"""``eaglequant export``: the orchestrator, one checklist from BF16 draft to FP8 folder.

check (no heavy imports) -> load -> calibrate -> quantize with Quark -> measure
-> config with regex exclusions -> shard + index -> verify by reading back ->
manifest. Everything is written into a temporary sibling of the output folder
and renamed into place only when the read-back checks pass.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from eaglequant import __version__
from eaglequant.checkpoint import CONFIG_FILE, Checkpoint, read_checkpoint
from eaglequant.draft import DraftDims, require_bf16_draft
from eaglequant.errors import CheckFailed, InputError
from eaglequant.exclusions import rewrite_exclude
from eaglequant.output import atomic_output_dir, check_output_path
from eaglequant.readback import sha256_file
from eaglequant.recipe import Recipe

MANIFEST_FILE = "eaglequant.json"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class CalibrationSource:
    """Where calibration inputs come from: a target + data, a capture folder, or none."""

    kind: Literal["target", "capture", "none"]
    target: Path | None = None
    data: Path | None = None
    capture: Path | None = None
    samples: int | None = None
    seq_len: int | None = None
    trust_remote_code: bool = False

    def describe(self) -> str:
        if self.kind == "target":
            return f"target {self.target} on {self.data}"
        if self.kind == "capture":
            return f"captured hidden states {self.capture}"
        return "none (fixed input range from the recipe; scales NOT calibrated)"


@dataclass(frozen=True)
class ExportRequest:
    src: Path
    out: Path
    recipe: Recipe
    calibration: CalibrationSource
    max_shard_size: int
    overwrite: bool = False
    dry_run: bool = False


@dataclass
class ExportPlan:
    """What the checks established before any heavy work."""

    ckpt: Checkpoint
    dims: DraftDims
    aux_layer_ids: tuple[int, ...] | None
    steps: list[str]


@dataclass
class ExportResult:
    out: Path
    plan: ExportPlan
    dry_run: bool = False
    manifest: dict[str, Any] = field(default_factory=dict)


def plan_export(request: ExportRequest) -> ExportPlan:
    """Check input, recipe, calibration source and output; import nothing heavy."""
    ckpt = read_checkpoint(request.src)
    dims = require_bf16_draft(ckpt)
    check_output_path(request.out, [request.src], request.overwrite)
    calib, recipe = request.calibration, request.recipe
    aux_ids = dims.aux_layer_ids
    if calib.kind == "target":
        from eaglequant.quantize.calibrate import check_target_fits

        assert calib.target is not None and calib.data is not None
        aux_ids = check_target_fits(calib.target, dims)
        if not calib.data.is_file():
            raise InputError(f"{calib.data}: no such calibration data file")
    elif calib.kind == "capture":
        assert calib.capture is not None
        if not calib.capture.exists():
            raise InputError(f"{calib.capture}: no such capture folder; run `eaglequant capture`")
    no_embeddings = "embed_tokens.weight" not in ckpt.tensors
    if no_embeddings and calib.kind == "none" and recipe.needs_calibration:
        raise InputError(
            f"{request.src}: the draft has no embed_tokens, so calibration needs the target's "
            "embeddings: pass --calib-target/--calib-data or a capture made with --embeddings"
        )
    flow = "quantize_model (static)" if recipe.needs_calibration else "direct_quantize_checkpoint"
    steps = [
        f"load {request.src} ({len(ckpt.tensors)} tensors, {ckpt.total_bytes} bytes)",
        f"calibrate: {calib.describe()}",
        f"quantize with Quark {flow}, recipe {recipe.name}",
        f"write {request.out} with exclude {rewrite_exclude(list(recipe.exclude))}",
        "verify the written folder by reading it back",
    ]
    return ExportPlan(ckpt, dims, aux_ids, steps)


def export_draft(request: ExportRequest, progress: Progress = lambda _msg: None) -> ExportResult:
    """Run the whole export; see the module docstring for the steps."""
    plan = plan_export(request)
    if request.dry_run:
        return ExportResult(request.out, plan, dry_run=True)
    from eaglequant.quantize.layout import start_writing

    timings: dict[str, float] = {}
    with atomic_output_dir(request.out, request.overwrite) as temp:
        stage = _Stages(timings, progress)
        writer = start_writing(temp, plan.ckpt, request.recipe, request.max_shard_size)
        try:
            from eaglequant.quantize import pipeline  # torch and co., while the copy runs

            with stage("load"):
                model = pipeline.load(plan, request)
            with stage("calibrate"):
                calib = pipeline.calibrate(plan, request, model)
            with stage("quantize"):
                quark = pipeline.quantize(plan, request, model, calib, temp)
            with stage("measure"):
                measurement = pipeline.measure_export(
                    plan.ckpt, model, quark, request.recipe, calib
                )
                del model  # not needed to write: free it before the read-back
            with stage("write"):
                config = output_config(plan.ckpt.config, quark.quantization_config, request.recipe)
                written = pipeline.finish_writing(
                    writer, plan.ckpt, quark.tensors, config, request.max_shard_size
                )
            with stage("verify"):
                digests = pipeline.verify(temp, plan.ckpt, written)
        finally:
            writer.cancel()
        timings["background_copy"] = round(writer.background_s, 3)
        timings.update({f"quantize.{name}": value for name, value in quark.timings.items()})
        manifest = build_manifest(
            request, plan, calib, measurement, timings, temp, written.files, digests
        )
        (temp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        (temp / MANIFEST_FILE).chmod(0o644)
    return ExportResult(request.out, plan, manifest=manifest)


class _Stages:
    """Times each stage and reports it through ``progress``."""

    def __init__(self, timings: dict[str, float], progress: Progress) -> None:
        self.timings, self.progress = timings, progress

    def __call__(self, name: str) -> _Stage:
        return _Stage(self, name)


class _Stage:
    def __init__(self, owner: _Stages, name: str) -> None:
        self.owner, self.name = owner, name

    def __enter__(self) -> None:
        self.owner.progress(f"{self.name} ...")
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self.started
        self.owner.timings[self.name] = round(elapsed, 3)
        if exc[0] is None:
            self.owner.progress(f"{self.name} done in {elapsed:.1f}s")


def output_config(
    source: dict[str, Any], quark_qcfg: dict[str, Any], recipe: Recipe
) -> dict[str, Any]:
    """The input config plus Quark's quantization_config, exclusions as vLLM-matching regex."""
    qcfg = dict(quark_qcfg)
    qcfg["exclude"] = rewrite_exclude(list(recipe.exclude))
    export = dict(qcfg.get("export") or {})
    if not isinstance(export.get("kv_cache_group"), list):
        export["kv_cache_group"] = []
    qcfg["export"] = export
    config = dict(source)
    config["quantization_config"] = qcfg
    return config


def build_manifest(
    request: ExportRequest,
    plan: ExportPlan,
    calib: Any,
    measurement: Any,
    timings: dict[str, float],
    folder: Path,
    files: list[str],
    digests: dict[str, str],
) -> dict[str, Any]:
    """Provenance: versions, recipe, calibration, per-layer numbers, file checksums."""
    return {
        "tool": "eaglequant",
        "version": __version__,
        "libraries": {
            name: _version(name)
            for name in ("amd-quark", "torch", "transformers", "safetensors", "huggingface_hub")
        },
        "python": platform.python_version(),
        "source": str(request.src),
        "recipe": request.recipe.to_dict(),
        "calibration": {
            "source": request.calibration.describe(),
            "kind": request.calibration.kind,
            "calibrated": request.calibration.kind != "none"
            or not request.recipe.needs_calibration,
            "sequences": calib.sequences,
            "tokens": calib.tokens,
            "held_out_tokens": measurement.held_out_tokens,
            "speculative_steps": request.recipe.calibration.steps,
            "aux_layer_ids": list(plan.aux_layer_ids) if plan.aux_layer_ids else None,
        },
        "layers": [asdict(layer) for layer in measurement.layers],
        "top1_agreement_by_step": measurement.top1_agreement,
        "timings_s": timings,
        "files": {
            name: digests.get(name) or sha256_file(folder / name)
            for name in sorted([*files, CONFIG_FILE])
        },
    }


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def fail_verification(folder: Path, problems: list[str]) -> None:
    raise CheckFailed(
        f"{folder}: the written output would be misread by vLLM: {problems[0]}"
        + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
    )
