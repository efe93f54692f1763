"""``eaglequant compare``: which format to ship — every candidate recipe exported from one
calibration capture, and every ready-made quantized draft given (another tool's, or an
earlier export), validated in vLLM against the BF16 draft; the card's recipe recommended
when it passes, unless a passing candidate is 5% smaller or decidedly better in acceptance
(``compare_report.recommend``), with the reason.

check (recipes, ready-made drafts, inputs, output; nothing heavy) -> capture the target's
hidden states once (or take a capture folder; none when there is no recipe and no folder)
-> export each recipe from that capture in this process (the module-flow recipes share one
Quark import) -> the engines, on every prompt set's prompts
at once: the BF16 draft and every candidate swapped into one engine, each run's output scored
teacher-forced in it for check 1 (``validate.single_engine``; a candidate with its own draft
KV-cache dtype, or ``engine_per_draft``, gets an engine of its own; ``reference_engine`` adds
the target alone in one more) -> per prompt set, each run's part of it
and the six checks under each candidate's recipe thresholds (a ready-made draft's: the
default recipe's; check 6 on the same capture, or on the engines' own ranges without one)
-> one row per candidate and prompt set -> ``compare.json`` and ``compare.md``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

from eaglequant.capture.run import CaptureEngine, CaptureRequest, capture_hidden_states
from eaglequant.engine.child_request import ControlTokens
from eaglequant.engine.config import EngineOptions, check_kv_cache_dtype, probe_vllm
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.output import check_output_path, write_text_atomic
from eaglequant.progress import Progress
from eaglequant.prompts.chat import render_for_target
from eaglequant.prompts.source import PromptSet
from eaglequant.quantization import method_of
from eaglequant.quantize.export import ExportRequest, export_draft
from eaglequant.quantize.sources import CalibrationSource
from eaglequant.recipe import DEFAULT_RECIPE, Recipe, ValidationSpec, load_recipe
from eaglequant.render.compare_tables import compare_markdown
from eaglequant.results.compare_report import (
    COMPARE_JSON,
    COMPARE_MD,
    COMPARE_SCHEMA_VERSION,
    CandidateRow,
    CompareReport,
    PromptSetSummary,
    recommend,
)
from eaglequant.results.engine_result import EngineRun
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.results.validation_report import PASS, Check, CheckId, ValidationReport
from eaglequant.results.workload import MAX_TOKENS, AcceptanceWorkload, concurrency_of
from eaglequant.rules.draft import (
    DraftDims,
    dims_from_config,
    quantized_tensors,
    require_bf16_draft,
    structure_problems,
)
from eaglequant.rules.exclusions import predict_fates
from eaglequant.rules.inspection import inspect_checkpoint, size_summary
from eaglequant.rules.speculative import SCALED_KV_CACHE_DTYPE, draft_kv_cache_dtype
from eaglequant.rules.target_fit import target_layers
from eaglequant.validate.acceptance_checks import ACCEPTANCE, PER_POSITION
from eaglequant.validate.lossless import DEFAULT_TIE_MARGIN, DEFAULT_TIE_STEPS
from eaglequant.validate.prompt_lengths import check_prompt_lengths
from eaglequant.validate.request import ValidateRequest, engine_prompts, require_layer_inspection
from eaglequant.validate.run_slices import slice_run
from eaglequant.validate.single_engine import (
    EngineRuns,
    control_tokens,
    run_per_draft,
    run_single,
)
from eaglequant.validate.validation import run_engine, validate_draft

BF16_ROLE, TARGET_ROLE = "bf16", "target"
CAPTURE_DIR, CANDIDATES_DIR = "capture", "candidates"
FAILURE_CHARS = 600
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+-]*"  # a ready-made draft's name: a role and a row


@dataclass(frozen=True, kw_only=True)
class ReadyDraft:
    """A quantized draft compared as it is (never exported): its name in the rows, its folder."""

    name: str
    draft: Path


@dataclass(frozen=True)
class _Candidate:
    """What each row is measured on: a recipe's export or a ready-made draft."""

    name: str
    draft: Path
    scheme: str
    validation: ValidationSpec  # the thresholds its checks are judged by
    ready_made: bool


@dataclass(frozen=True, kw_only=True)
class CompareRequest:
    baseline: Path
    target: Path
    prompt_sets: tuple[PromptSet, ...]  # each reported on its own
    recipes: tuple[Recipe, ...]
    out: Path
    ready_made: tuple[ReadyDraft, ...] = ()  # validated as they are, beside the recipes
    calib_data: Path | None = None  # with the target: capture once from this text
    hidden_states: Path | None = None  # or a capture folder from `eaglequant capture`
    k: int = 3
    max_tokens: int = MAX_TOKENS
    draft_kv_cache_dtype: str | None = None
    engine: EngineOptions = field(default_factory=EngineOptions)
    capture: CaptureEngine = field(default_factory=CaptureEngine)
    engine_timeout_s: float = 600.0
    max_shard_size: int = 5 * 10**9
    engine_per_draft: bool = False
    reference_engine: bool = False  # check 1 against a target-alone engine (one more load)
    tie_margin: float = DEFAULT_TIE_MARGIN  # check 1: a token this close to the best is a tie
    tie_steps: float = DEFAULT_TIE_STEPS  # or this many BF16 steps of the best raw logit
    chat_template: bool = True  # render with the target's chat template when it has one
    overwrite: bool = False


class EngineRunner(Protocol):
    """Runs every engine compare needs: the target alone, the BF16 draft, each candidate."""

    def __call__(
        self,
        base: ValidateRequest,
        candidates: Mapping[str, ValidateRequest],
        progress: Progress,
    ) -> EngineRuns:
        """Runs by role: ``target``, ``bf16`` and each candidate's recipe name."""
        ...


def run_engines(
    base: ValidateRequest,
    candidates: Mapping[str, ValidateRequest],
    progress: Progress,
    *,
    per_draft: bool = False,
) -> EngineRuns:
    """The target alone in its own engine; the BF16 draft and the candidates in one shared
    engine, but a candidate with its own draft KV-cache dtype (a swap keeps the engine's KV
    cache) or all of them with ``per_draft`` in engines of their own."""
    rendered = engine_prompts(base)
    by_draft = {base.baseline: base} | {c.draft: c for c in candidates.values()}

    def run_one(draft: Path | None, control: ControlTokens | None) -> EngineRun:
        request = by_draft.get(draft, base) if draft is not None else base
        kv = request.draft_kv_cache_dtype if draft == request.draft else None
        return run_engine(request, draft, rendered, kv, control)

    roles: list[tuple[str, Path | None]] = [(TARGET_ROLE, None), (BF16_ROLE, base.baseline)]
    if not base.reference_engine:
        roles = roles[1:]  # check 1 teacher-forced in each draft's own engine
    own_kv = [(n, c.draft) for n, c in candidates.items() if c.draft_kv_cache_dtype is not None]
    swapped = [(n, c.draft) for n, c in candidates.items() if c.draft_kv_cache_dtype is None]
    if not per_draft and (no_swap := probe_vllm(sys.executable).gate("draft swap")):
        progress(f"{no_swap}: one engine per draft")
        per_draft = True
    if per_draft:
        return run_per_draft([*roles, *swapped, *own_kv], run_one, progress)
    runs = run_single(base, rendered, [*roles, *swapped], run_one, progress)
    if own_kv:
        progress("a draft KV-cache dtype is set: its own engine (a swap keeps the KV cache)")
        control = control_tokens(runs.engines.get(BF16_ROLE))
        others = run_per_draft(own_kv, run_one, progress, control)
        runs.engines |= others.engines
        runs.target_loads += others.target_loads
    return runs


def check_request(request: CompareRequest) -> None:
    """Everything checked before any heavy work."""
    if not request.recipes and not request.ready_made:
        raise InputError(
            "nothing to compare; name a recipe (fp8-static,mxfp4) or give a ready-made draft"
        )
    sources = [p.source for p in request.prompt_sets]
    if not sources:
        raise InputError("no prompts to compare on; pass --prompts FILE|SET (repeatable)")
    if len(set(sources)) != len(sources):
        raise InputError(f"prompt sets {sources}: each set may be given once")
    names = [r.name for r in request.recipes]
    if len(set(names)) != len(names):
        raise InputError(f"recipes {names}: each recipe may be compared once")
    dims = require_bf16_draft(read_checkpoint(request.baseline), "compare's baseline")
    _check_ready_made(request, dims)
    if not request.target.is_dir():
        raise InputError(f"{request.target}: no such target folder")
    inputs = [request.baseline, request.target, *(d.draft for d in request.ready_made)]
    check_output_path(request.out, inputs, request.overwrite)
    if request.recipes and (request.calib_data is None) == (request.hidden_states is None):
        raise InputError(
            "compare calibrates every candidate from one capture: pass --calib-data FILE "
            "(captured from --target) or --calib-hidden-states DIR"
        )
    if not request.recipes and request.calib_data is not None:
        raise InputError(
            f"{request.calib_data}: no recipe to calibrate (only ready-made drafts); pass a "
            "capture folder for check 6 (--calib-hidden-states DIR) or neither"
        )
    if request.calib_data is not None and not request.calib_data.is_file():
        raise InputError(f"{request.calib_data}: no such calibration data file")
    asked = [("--draft-kv-cache-dtype", request.draft_kv_cache_dtype)]
    if request.draft_kv_cache_dtype is None:
        asked = [
            (f"recipe {r.name} (kv_cache.dtype)", SCALED_KV_CACHE_DTYPE)
            for r in request.recipes
            if r.kv_cache.scaled
        ]
    install = probe_vllm(sys.executable)
    require_layer_inspection(install, "compare")
    for source, kv in asked:
        check_kv_cache_dtype(kv, install, source)
    for prompt_set in request.prompt_sets:
        rendered = render_for_target(request.target, prompt_set.texts, request.chat_template)
        check_prompt_lengths(
            request.target,
            rendered,
            engine=request.engine,
            install=install,
            source=prompt_set.source,
        )


def _check_ready_made(request: CompareRequest, baseline: DraftDims) -> None:
    """Each ready-made draft: a name no recipe, role or other draft has, and a quantized draft
    of the BF16 draft's shapes (InputError naming it otherwise)."""
    taken = {r.name for r in request.recipes} | {BF16_ROLE, TARGET_ROLE, DEFAULT_RECIPE}
    folders: set[Path] = set()
    for ready in request.ready_made:
        where = f"{ready.draft}: ready-made draft '{ready.name}'"
        if not re.fullmatch(NAME_PATTERN, ready.name):
            raise InputError(f"{where}: a name of letters, digits, '.', '_', '+', '-'; name it")
        if ready.name in taken:
            raise InputError(
                f"{where}: the name is taken (by a recipe, an engine role or another draft); "
                "give it another name"
            )
        taken.add(ready.name)
        if ready.draft.resolve() in folders:
            raise InputError(f"{where}: this folder is given twice; give it once")
        folders.add(ready.draft.resolve())
        if not (ready.draft / "config.json").is_file():
            raise InputError(f"{where}: no config.json there; pass a quantized draft's folder")
        ckpt = read_checkpoint(ready.draft)
        problems = structure_problems(ckpt)
        if problems:
            raise InputError(f"{where}: {problems[0]}")
        if ckpt.flat_config.get("quantization_config") is None and not quantized_tensors(ckpt):
            raise InputError(
                f"{where}: not quantized (no quantization_config, no quantized tensor); pass "
                "an FP8 draft made from the BF16 draft"
            )
        dims = dims_from_config(ckpt.flat_config, str(ready.draft / "config.json"))
        differs = _first_difference(dims, baseline)
        if differs:
            raise InputError(
                f"{where}: not a draft of the BF16 draft's shapes ({differs}); pass one "
                f"quantized from {request.baseline}"
            )


def _first_difference(dims: DraftDims, baseline: DraftDims) -> str | None:
    """``hidden 576, the BF16 draft's 256`` for the first dimension that differs."""
    for item in dataclasses.fields(DraftDims):
        mine, theirs = getattr(dims, item.name), getattr(baseline, item.name)
        if mine != theirs:
            return f"{item.name} {mine}, the BF16 draft's {theirs}"
    return None


def compare(
    request: CompareRequest,
    progress: Progress = lambda _m: None,
    runner: EngineRunner | None = None,
) -> CompareReport:
    """Capture once, export every candidate, validate each against the BF16 draft once."""
    check_request(request)
    timings: dict[str, float] = {}
    capture = request.hidden_states
    candidates: list[_Candidate] = []
    request.out.mkdir(parents=True, exist_ok=True)
    if request.recipes:
        (request.out / CANDIDATES_DIR).mkdir(exist_ok=True)
        started = time.perf_counter()
        capture = calibration = _capture_once(request, progress)
        timings["capture"] = round(time.perf_counter() - started, 3)
        for recipe in request.recipes:
            started = time.perf_counter()
            progress(f"candidate {recipe.name}: export ...")
            draft = _export(request, recipe, calibration, progress)
            candidates.append(
                _Candidate(recipe.name, draft, recipe.scheme(), recipe.validation, False)
            )
            timings[f"export.{recipe.name}"] = round(time.perf_counter() - started, 3)
    if request.ready_made:
        _say_problems(request, progress)
        default = load_recipe(DEFAULT_RECIPE).validation
        candidates += [
            _Candidate(d.name, d.draft, ready_scheme(d.draft), default, True)
            for d in request.ready_made
        ]
    every = PromptSet(
        source="+".join(p.source for p in request.prompt_sets),
        sha256="",
        prompts=[prompt for p in request.prompt_sets for prompt in p.prompts],
    )
    base = _validate_request(request, candidates[0], capture, every)
    requests = {c.name: _validate_request(request, c, capture, every) for c in candidates}
    started = time.perf_counter()
    runner = runner or partial(run_engines, per_draft=request.engine_per_draft)
    runs = runner(base, requests, progress)
    timings["engines"] = round(time.perf_counter() - started, 3)
    rows, sets, start = [], [], 0
    for prompt_set in request.prompt_sets:
        stop = start + len(prompt_set.prompts)
        engines = {role: _part(run, start, stop, request) for role, run in runs.engines.items()}
        sets.append(_set_summary(prompt_set, engines[BF16_ROLE], request))
        for candidate in candidates:
            started = time.perf_counter()
            label = f"candidate {candidate.name}" + (
                f" on {prompt_set.source}" if len(request.prompt_sets) > 1 else ""
            )
            progress(f"{label}: checks ...")
            checked = _validate_request(request, candidate, capture, prompt_set)
            report = validate_draft(
                checked,
                progress=_labelled(progress, label),
                reuse={role: engines[role] for role in (TARGET_ROLE, BF16_ROLE) if role in engines}
                | {"fp8": engines[candidate.name]},
            )
            rows.append(_row(request, candidate, checked, report))
            key = f"validate.{candidate.name}" + (
                f".{prompt_set.source}" if len(request.prompt_sets) > 1 else ""
            )
            timings[key] = round(time.perf_counter() - started, 3)
        start = stop
    result = _report(request, rows, sets, runs, timings)
    _write(request.out, result)
    return result


def _say_problems(request: CompareRequest, progress: Progress) -> None:
    """What ``inspect`` finds wrong with each ready-made draft, one line each: validated all
    the same (the checks measure what it costs), but the fix is named before the engines."""
    layers = target_layers(request.target)[1]
    for ready in request.ready_made:
        for problem in inspect_checkpoint(ready.draft, layers).problems:
            progress(f"candidate {ready.name}: inspect: {problem}")


def ready_scheme(draft: Path) -> str:
    """A ready-made draft's format in one line, from what its config declares and vLLM would
    build: ``NVIDIA ModelOpt: fp8 w:per_tensor a:per_tensor static; BF16: lm_head``."""
    ckpt = read_checkpoint(draft)
    qcfg = ckpt.flat_config.get("quantization_config")
    method = method_of(qcfg)
    if method is None:
        declared = qcfg.get("quant_method") if isinstance(qcfg, dict) else None
        return (
            f"quant_method {declared!r} (not predicted)" if declared else "no quantization_config"
        )
    fates = predict_fates(ckpt.flat_config)
    schemes = list(dict.fromkeys(f.scheme for f in fates if f.quantized))
    kept = [f.vllm_name.rsplit(".", 1)[-1] for f in fates if not f.quantized]
    bf16 = f"; BF16: {', '.join(dict.fromkeys(kept))}" if kept else ""
    return f"{method.label}: {' + '.join(schemes) or 'nothing quantized'}{bf16}"


def _labelled(progress: Progress, label: str) -> Progress:
    """``progress`` with every line prefixed by ``label``."""
    return lambda message: progress(f"{label}: {message}")


def _part(run: EngineRun, start: int, stop: int, request: CompareRequest) -> EngineRun:
    """A run as one prompt set's: the whole run when there is one set."""
    return run if len(request.prompt_sets) == 1 else slice_run(run, start, stop)


def _set_summary(
    prompt_set: PromptSet, bf16_run: EngineRun, request: CompareRequest
) -> PromptSetSummary:
    result = bf16_run.get("result")
    bf16 = SpecDecodeCounts.from_vllm(result["metrics"] if result else {}).acceptance()
    return PromptSetSummary(
        source=prompt_set.source,
        sha256=prompt_set.sha256,
        prompts=len(prompt_set.prompts),
        baseline_mean_acceptance=bf16.mean_length,
        baseline_per_position=list(bf16.per_position),
        workload=AcceptanceWorkload(
            prompt_set=prompt_set.source,
            prompts=len(prompt_set.prompts),
            chat_template=request.chat_template,
            k=request.k,
            max_tokens=request.max_tokens,
            ignore_eos=True,  # every engine run generates to max_tokens
            concurrency=concurrency_of(request.engine.engine_args),
        ),
    )


def _capture_once(request: CompareRequest, progress: Progress) -> Path:
    if request.hidden_states is not None:
        return request.hidden_states
    assert request.calib_data is not None
    progress("capture the target's hidden states (once, for every candidate) ...")
    needed = max(r.calibration.samples + r.calibration.held_out for r in request.recipes)
    folder = request.out / CAPTURE_DIR
    capture_hidden_states(
        CaptureRequest(
            target=request.target,
            data=request.calib_data,
            out=folder,
            engine=request.capture,
            draft=request.baseline,
            samples=needed,
            seq_len=max(r.calibration.seq_len for r in request.recipes),
            embeddings=True,
            overwrite=request.overwrite,
        ),
        progress,
    )
    return folder


def _export(request: CompareRequest, recipe: Recipe, capture: Path, progress: Progress) -> Path:
    out = request.out / CANDIDATES_DIR / recipe.name
    export_draft(
        ExportRequest(
            src=request.baseline,
            out=out,
            recipe=recipe,
            calibration=(
                CalibrationSource(kind="none")
                if recipe.calibration.fixed
                else CalibrationSource(kind="capture", capture=capture)
            ),
            max_shard_size=request.max_shard_size,
            overwrite=request.overwrite,
        ),
        lambda m: progress(f"candidate {recipe.name}: export: {m}"),
    )
    return out


def _validate_request(
    request: CompareRequest, candidate: _Candidate, capture: Path | None, prompt_set: PromptSet
) -> ValidateRequest:
    thresholds = candidate.validation
    return ValidateRequest(
        target=request.target,
        draft=candidate.draft,
        baseline=request.baseline,
        prompts=prompt_set.texts,
        categories=prompt_set.categories,
        prompt_set=prompt_set.describe(),
        chat_template=request.chat_template,
        min_category_drafts=thresholds.min_category_drafts,
        k=request.k,
        max_tokens=request.max_tokens,
        min_acceptance_ratio=thresholds.min_acceptance_ratio,
        min_position_ratio=thresholds.min_position_ratio,
        scale_tolerance=thresholds.scale_tolerance,
        engine_timeout_s=request.engine_timeout_s,
        engine=request.engine,
        capture=request.capture,
        hidden_states=capture,
        draft_kv_cache_dtype=draft_kv_cache_dtype(
            request.draft_kv_cache_dtype, read_checkpoint(candidate.draft).flat_config
        ),
        reference_engine=request.reference_engine,
        tie_margin=request.tie_margin,
        tie_steps=request.tie_steps,
    )


def _kv_cache(request: CompareRequest, kv: str | None) -> str:
    """The candidate's draft KV cache (``kv``: the dtype its validation ran) as its row names it."""
    if request.draft_kv_cache_dtype is not None or kv is None:
        return request.draft_kv_cache_dtype or "auto (the target's)"
    return f"{kv} (calibrated K/V scales)"


def _row(
    request: CompareRequest,
    candidate: _Candidate,
    checked: ValidateRequest,
    report: ValidationReport,
) -> CandidateRow:
    acceptance = report.check(ACCEPTANCE)  # None when an engine failed: "engines" alone
    per_position = report.check(PER_POSITION)
    lossless = report.check(CheckId.LOSSLESS)
    judged = acceptance.intervals if acceptance else ()
    size = size_summary(read_checkpoint(checked.draft))
    baseline_bytes = read_checkpoint(request.baseline).total_bytes
    return CandidateRow(
        recipe=candidate.name,
        scheme=candidate.scheme,
        kv_cache_dtype=_kv_cache(request, checked.draft_kv_cache_dtype),
        bytes_on_disk=size.bytes_on_disk,
        bytes_ratio=round(size.bytes_on_disk / baseline_bytes, 4),
        quantized_fraction=round(size.quantized_fraction, 4),
        lossless=bool(lossless and lossless.passed),
        mean_acceptance=acceptance.fp8_values[0] if acceptance and acceptance.fp8_values else None,
        per_position=list(per_position.fp8_values if per_position else ()),
        acceptance_ratio=judged[0].point if judged else None,
        min_acceptance_ratio=candidate.validation.min_acceptance_ratio,
        passed=report.passed,
        failed_checks=[str(c.name) for c in report.checks if c.counted != PASS],
        failure=_failure(report.checks),
        verdict=report.verdict,
        prompt_set=report.prompt_set["source"] if report.prompt_set else "",
        categories=report.categories,
        min_category_drafts=report.min_category_drafts,
        acceptance_interval=judged[0] if judged else None,
        position_intervals=per_position.intervals if per_position else (),
        ready_made=candidate.ready_made,
    )


def _failure(checks: list[Check]) -> str | None:
    """The first failed check's detail; a failed engine's with its log's last error line."""
    failed = next((c for c in checks if c.counted != PASS), None)
    if failed is None:
        return None
    detail = failed.detail
    for tail in (failed.numbers or {}).get("log_tail", {}).values():
        errors = [line.strip() for line in tail.splitlines() if "Error" in line]
        if errors:
            detail += f": {errors[-1]}"
    return detail[:FAILURE_CHARS]


def _report(
    request: CompareRequest,
    rows: list[CandidateRow],
    sets: list[PromptSetSummary],
    runs: EngineRuns,
    timings: dict[str, float],
) -> CompareReport:
    choice = recommend(rows)
    return CompareReport(
        schema_version=COMPARE_SCHEMA_VERSION,
        baseline=str(request.baseline),
        target=str(request.target),
        k=request.k,
        max_tokens=request.max_tokens,
        baseline_bytes=read_checkpoint(request.baseline).total_bytes,
        prompt_sets=sets,
        rows=rows,
        recommended=choice.row.recipe if choice else None,
        recommendation_reason=choice.reason if choice else None,
        timings_s=timings,
        engine_mode=runs.mode,
        target_loads=runs.target_loads,
        engine_fallback=runs.fallback,
    )


def _write(out: Path, report: CompareReport) -> None:
    """compare.json and compare.md, each written beside its name and renamed into place."""
    write_text_atomic(out / COMPARE_JSON, json.dumps(report.to_json(), indent=2) + "\n")
    write_text_atomic(out / COMPARE_MD, compare_markdown(report))
