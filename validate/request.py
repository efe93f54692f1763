"""What ``validate`` is asked: the request, its thresholds, and every check of its inputs that
can be made before any engine starts (``check_inputs``); the prompts as the engines get them."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from eaglequant.capture.run import CaptureEngine, check_engine
from eaglequant.capture.store import check_capture
from eaglequant.engine.config import (
    EngineOptions,
    VllmInstall,
    check_attention_backend,
    check_engine_args,
    check_kv_cache_dtype,
    probe_vllm,
)
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import Checkpoint, read_checkpoint
from eaglequant.prompts.chat import RenderedPrompts, render_for_target
from eaglequant.prompts.source import text_hashes
from eaglequant.prompts.turns import SecondTurns, SecondTurnsJson, asked_turns
from eaglequant.recipe import ValidationSpec, load_recipe
from eaglequant.results.binding import Binding, binding
from eaglequant.results.manifest import MANIFEST_FILE, read_json_object, read_manifest
from eaglequant.results.validation_report import CalibrationOverlap, PromptSetRecord
from eaglequant.results.workload import MAX_TOKENS
from eaglequant.rules.draft import dims_from_config, refuse_quantized, structure_problems
from eaglequant.rules.speculative import kv_source
from eaglequant.rules.target_fit import check_target_fits
from eaglequant.validate.lossless import DEFAULT_MODE, DEFAULT_TIE_MARGIN, DEFAULT_TIE_STEPS
from eaglequant.validate.regression import RunCounts, check_comparable
from eaglequant.validate.stats import DEFAULT_RESAMPLES, DEFAULT_SEED


@dataclass(frozen=True, kw_only=True)
class ValidateRequest:
    target: Path
    draft: Path
    baseline: Path
    prompts: list[str]
    k: int = 3
    max_tokens: int = MAX_TOKENS
    min_acceptance_ratio: float = ValidationSpec.min_acceptance_ratio
    min_position_ratio: float = ValidationSpec.min_position_ratio
    max_regression: float = ValidationSpec.max_regression
    scale_tolerance: float = ValidationSpec.scale_tolerance
    engine_timeout_s: float = 600.0
    engine: EngineOptions = field(default_factory=EngineOptions)
    lossless: str = DEFAULT_MODE
    tie_margin: float = DEFAULT_TIE_MARGIN
    tie_steps: float = DEFAULT_TIE_STEPS  # or this many BF16 steps of the best raw logit
    capture: CaptureEngine = field(default_factory=CaptureEngine)
    hidden_states: Path | None = None
    draft_kv_cache_dtype: str | None = None  # the validated draft's KV cache (the BF16 one: auto)
    draft_attention_backend: str | None = None  # both drafts' (vLLM's name); None: vLLM picks
    categories: list[str] | None = None  # one per prompt
    # One per prompt: its second turn, measured after the target's own answer to the prompt
    # (None where it has none); None: first turns only.
    followups: list[str | None] | None = None
    min_category_drafts: int = ValidationSpec.min_category_drafts
    prompt_set: PromptSetRecord | None = None  # the prompts' source and sha256
    chat_template: bool = True  # render with the target's chat template when it has one
    against: RunCounts | None = None
    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED
    command: str | None = None  # how it was invoked, path-free (eaglequant.results.provenance)
    engine_per_draft: bool = False
    # Check 1 against a target-alone engine (a second target load) instead of teacher-forced
    # scores from the speculative engine itself.
    reference_engine: bool = False
    # Checks 2 and 5 from runs sampled at this temperature, one per seed, after each draft's
    # greedy run (which check 1 and the others keep); 0: greedy alone.
    temperature: float = 0.0
    sampling_seeds: tuple[int, ...] = ()


def validation_spec(draft: Path, recipe: str | None) -> ValidationSpec:
    """Thresholds: the named recipe's, else the exported-with recipe's (manifest), else default."""
    if recipe is not None:
        return load_recipe(recipe).validation
    manifest = draft / MANIFEST_FILE
    if not manifest.is_file():
        return load_recipe().validation
    block = read_manifest(draft).get("recipe", {}).get("validation")
    try:
        if not isinstance(block, dict):
            raise TypeError(block)
        return ValidationSpec(**block)
    except TypeError as exc:
        raise InputError(
            f"{manifest}: recipe.validation is not a validation block ({block!r}); "
            "re-export the draft or name the recipe to validate with"
        ) from exc


@dataclass(frozen=True)
class CheckedInputs:
    """What :func:`check_inputs` read and proved, each folder read once: the bytes validated
    (by role) and both drafts as vLLM reads them, for every later check."""

    files: dict[str, Binding]
    draft: Checkpoint
    baseline: Checkpoint


def check_inputs(request: ValidateRequest) -> CheckedInputs:
    """Everything that can be checked before any engine starts; the files it will validate
    and the drafts, read."""
    if not request.target.is_dir():
        raise InputError(f"{request.target}: no such target folder; pass the target model's folder")
    if request.categories is not None and len(request.categories) != len(request.prompts):
        raise InputError(
            f"{len(request.categories)} categories for {len(request.prompts)} prompts; "
            "give one category per prompt"
        )
    if request.followups is not None and len(request.followups) != len(request.prompts):
        raise InputError(
            f"{len(request.followups)} second turns for {len(request.prompts)} prompts; "
            "give one per prompt (None where a prompt has none)"
        )
    files = {"draft": binding(request.draft), "baseline": binding(request.baseline)}
    dims, read = {}, {}
    for folder in (request.draft, request.baseline):
        ckpt = read[folder] = read_checkpoint(folder)  # as vLLM reads it, in any draft format
        problems = [p for p in structure_problems(ckpt) if not p.loadable]
        if problems:
            raise InputError(str(problems[0]))
        dims[folder] = dims_from_config(ckpt.flat_config, str(folder / "config.json"))
        check_target_fits(request.target, dims[folder])
        if folder == request.baseline:
            refuse_quantized(ckpt, "validate's baseline")
        if folder == request.draft and "quantization_config" not in ckpt.flat_config:
            raise InputError(
                f"{request.draft}: has no quantization_config; pass the FP8 draft to validate"
            )
    check_sampling(request.temperature, request.sampling_seeds)
    if request.against is not None:
        check_comparable(request.against, request.k)
    install = probe_vllm(sys.executable)
    require_layer_inspection(install, "validate")
    check_engine_args(request.engine.engine_args, install.engine_args)
    check_kv_cache_dtype(request.draft_kv_cache_dtype, install, kv_source(request.draft))
    check_attention_backend(request.draft_attention_backend, install, "--draft-attention-backend")
    if request.hidden_states is not None:
        check_capture(request.hidden_states, dims[request.baseline])
    else:
        check_engine(request.capture)
    return CheckedInputs(files, read[request.draft], read[request.baseline])


def check_sampling(temperature: float, seeds: tuple[int, ...]) -> None:
    """A sampled validation names its seeds, each once; a greedy one names none."""
    if temperature < 0:
        raise InputError(f"temperature {temperature}: give 0 (greedy) or more")
    if temperature == 0 and seeds:
        raise InputError(
            f"sampling seeds {list(seeds)} without a temperature: give a temperature above 0 "
            "to sample, or no seed for greedy"
        )
    if temperature > 0 and not seeds:
        raise InputError(f"temperature {temperature}: name at least one sampling seed")
    if len(set(seeds)) != len(seeds) or any(seed < 0 for seed in seeds):
        raise InputError(f"sampling seeds {list(seeds)}: give each seed once, 0 or more")


def require_layer_inspection(install: VllmInstall, command: str) -> None:
    """Refuse ``command`` before any engine starts where this vLLM cannot show the layers it
    built or their K/V scales (check 3 would observe nothing)."""
    install.require(command, "layer inspection (V1 runner)", "layer inspection (Model Runner V2)")
    install.require(command, "K/V-scale check")


def engine_prompts(request: ValidateRequest) -> RenderedPrompts:
    """The prompts as every engine gets them: through the target's chat template, if asked;
    with ``followups``, their second turns asked of the first engine that runs."""
    rendered = render_for_target(request.target, request.prompts, request.chat_template)
    if not request.followups:
        return rendered
    asked: SecondTurnsJson = {
        "turns": asked_turns(request.prompts, request.followups),
        "chat_template": rendered.chat_template,
        "tokenizer": str(request.target),
        "trust_remote_code": False,  # as the first turns were rendered
        "max_tokens": request.max_tokens,
    }
    return replace(rendered, second_turns=SecondTurns(asked))


def calibration_overlap(draft: Path, prompts: list[str]) -> CalibrationOverlap | None:
    """How many validation prompts the draft was calibrated on (its manifest's text hashes);
    None when the manifest records none."""
    manifest = draft / MANIFEST_FILE
    if not manifest.is_file():
        return None
    calibration = read_json_object(manifest, "export manifest").get("calibration") or {}
    data = calibration.get("data") or (calibration.get("capture") or {}).get("data")
    if not isinstance(data, dict) or not data.get("text_hashes"):
        return None
    calibrated = set(data["text_hashes"])
    shared = sum(1 for digest in text_hashes(prompts) if digest in calibrated)
    return {"calibration": data.get("source"), "shared": shared, "prompts": len(prompts)}
