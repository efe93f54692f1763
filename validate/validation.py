"""``eaglequant validate``: prove an FP8 draft in vLLM speculative decoding against its BF16 draft.

Three engine runs (target alone, target + BF16 baseline draft, target + FP8
draft), in child processes with a timeout: by default both drafts are served by
one engine that swaps the draft (``single_engine``), else each run in its own
engine (``engine_per_draft``); greedy, the same prompts and
engine configuration (``eaglequant.engine.config``: the target's parallelism, the
user's engine arguments, CPU-only defaults only on CPU), then six checks, each
reported with its numbers:

1. lossless: each speculative run's tokens equal the target-only tokens
   (a first divergence to a token nearly tied with the target's best
   passes, as vLLM's GPU kernels are not batch-invariant, unless ``lossless``
   is ``strict``; see ``lossless.py``);
2. acceptance: the FP8/BF16 ratio of mean acceptance length, with a seeded
   paired-bootstrap 95% interval over prompts (``stats.py``): PASS when the
   interval clears the recipe's ratio, FAIL when it lies wholly below,
   otherwise INCONCLUSIVE (about how many prompts would decide);
3. layers: vLLM built ``fc`` and ``lm_head`` unquantized and every midlayer
   projection with the Quark scheme ``inspect`` predicts from the draft's config
   (``QuarkW8A8Fp8``, ``QuarkOCP_MX``, ``QuarkW4A8_MXFP4_FP8``), quantized
   weights and finite positive scales;
4. log: no "Attempted to load weight … float8_e4m3fn" (a bad exclusion);
5. per-position acceptance: each position's FP8/BF16 acceptance-rate ratio,
   judged as check 2 against the recipe's per-position ratio;
6. scale plausibility, outside vLLM: the BF16 draft run on the target's
   hidden states (captured with the chosen engine on the validation sequences,
   or read from a capture folder) gives each layer's input range;
   ``input_scale`` x 448 and ``weight_scale`` x 448 must lie within the
   recipe's factor of the measured ranges, and no scale may be missing (OCP
   MX weights: each 32-element block's E8M0 scale against the block's amax);
7. regression (``--against`` an earlier report): this FP8 run's acceptance
   against the earlier one's (``regression.py``).

INCONCLUSIVE counts as not passed. The report (``to_json``) carries its kind
and schema version (``eaglequant.validation_report``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from eaglequant.binding import binding
from eaglequant.capture.run import CaptureEngine, check_engine
from eaglequant.capture.store import check_capture
from eaglequant.draft import (
    check_target_fits,
    dims_from_config,
    kv_scale_pairs,
    structure_problems,
)
from eaglequant.engine.config import (
    EngineOptions,
    check_attention_backend,
    check_engine_args,
    check_kv_cache_dtype,
    llm_kwargs,
    probe_vllm,
)
from eaglequant.engine.process import ChildRun, log_tail, run_child
from eaglequant.engine.result import (
    SCALE_NAMES,
    DraftAttention,
    DraftLayer,
    EngineRun,
    ScaleStats,
    read_engine_result,
)
from eaglequant.environment import environment
from eaglequant.errors import EngineFailed, InputError
from eaglequant.exclusions import predict_fates
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.manifest import MANIFEST_FILE, read_json_object, read_manifest
from eaglequant.prompts.chat import RenderedPrompts, render_for_target
from eaglequant.prompts.format import read_prompts as read_prompts
from eaglequant.prompts.source import text_hashes
from eaglequant.recipe import E8M0_NAN, ValidationSpec, load_recipe
from eaglequant.speculative import draft_kv_cache_dtype, kv_source, speculative_config
from eaglequant.validate.acceptance import (
    AcceptanceThresholds,
    engine_acceptance_checks,
    prompt_counts,
)
from eaglequant.validate.categories import (
    ROLES,
    by_category,
    category_checks,
    category_regression,
)
from eaglequant.validate.check import Check
from eaglequant.validate.lossless import (
    DEFAULT_MODE,
    DEFAULT_TIE_MARGIN,
    TEACHER_FORCED_KEY,
    TEACHER_FORCED_RANKS,
    TOP_LOGPROBS,
    lossless_check,
    teacher_forced_check,
)
from eaglequant.validate.regression import NAME as REGRESSION
from eaglequant.validate.regression import RunCounts, check_comparable, regression_check
from eaglequant.validate.single_engine import PER_DRAFT, run_per_draft, run_single
from eaglequant.validate.stats import DEFAULT_RESAMPLES, DEFAULT_SEED, overall_verdict
from eaglequant.validation_report import REPORT_KIND, SCHEMA_VERSION, prompts_digest

BAD_EXCLUSION_SIGNATURE = "Attempted to load weight"


@dataclass(frozen=True, kw_only=True)
class ValidateRequest:
    target: Path
    draft: Path
    baseline: Path
    prompts: list[str]
    k: int = 3
    max_tokens: int = 48
    min_acceptance_ratio: float = ValidationSpec.min_acceptance_ratio
    min_position_ratio: float = ValidationSpec.min_position_ratio
    max_regression: float = ValidationSpec.max_regression
    scale_tolerance: float = ValidationSpec.scale_tolerance
    engine_timeout_s: float = 600.0
    engine: EngineOptions = field(default_factory=EngineOptions)
    lossless: str = DEFAULT_MODE
    tie_margin: float = DEFAULT_TIE_MARGIN
    capture: CaptureEngine = field(default_factory=CaptureEngine)
    hidden_states: Path | None = None
    draft_kv_cache_dtype: str | None = None  # the validated draft's KV cache (the BF16 one: auto)
    draft_attention_backend: str | None = None  # both drafts' (vLLM's name); None: vLLM picks
    categories: list[str] | None = None  # one per prompt
    min_category_drafts: int = ValidationSpec.min_category_drafts
    prompt_set: dict[str, Any] | None = None  # the prompts' source and sha256
    chat_template: bool = True  # render with the target's chat template when it has one
    against: RunCounts | None = None
    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED
    command: str | None = None  # how it was invoked, path-free (eaglequant.provenance)
    engine_per_draft: bool = False
    # Check 1 against a target-alone engine (a second target load) instead of teacher-forced
    # scores from the speculative engine itself.
    reference_engine: bool = False


@dataclass
class ValidationReport:
    target: str
    draft: str
    baseline: str
    k: int
    prompts: int
    max_tokens: int
    backend: str
    plugin_active: bool
    engines: dict[str, dict[str, Any]]
    checks: list[Check]
    prompts_sha256: str
    serve_command: str | None = None
    # The bytes validated: {"draft"|"baseline": {"name", "files": {relative path: sha256}}}.
    files: dict[str, Any] = field(default_factory=dict)
    command: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    chat_template: bool = False
    prompt_set: dict[str, Any] | None = None
    calibration_overlap: dict[str, Any] | None = None
    categories: dict[str, dict[str, Any]] | None = None
    min_category_drafts: int | None = None
    prompt_categories: list[str] | None = None
    engine_mode: str = PER_DRAFT
    target_loads: int = 0
    load_s: float = 0.0
    generate_s: float = 0.0
    score_s: float = 0.0  # of generate_s: check 1's teacher-forced scoring

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def verdict(self) -> str:
        return overall_verdict([c.verdict for c in self.checks])

    def to_json(self) -> dict[str, Any]:
        data = {"kind": REPORT_KIND, "schema_version": SCHEMA_VERSION, **asdict(self)}
        data["passed"] = self.passed
        data["verdict"] = self.verdict
        return data


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


def check_inputs(request: ValidateRequest) -> dict[str, Any]:
    """Everything that can be checked before any engine starts; the files it will validate."""
    if not request.target.is_dir():
        raise InputError(f"{request.target}: no such target folder; pass the target model's folder")
    if request.categories is not None and len(request.categories) != len(request.prompts):
        raise InputError(
            f"{len(request.categories)} categories for {len(request.prompts)} prompts; "
            "give one category per prompt"
        )
    files = {"draft": binding(request.draft), "baseline": binding(request.baseline)}
    dims = {}
    for folder in (request.draft, request.baseline):
        ckpt = read_checkpoint(folder)  # as vLLM reads it, in any draft format
        problems = [p for p in structure_problems(ckpt) if not p.loadable]
        if problems:
            raise InputError(str(problems[0]))
        dims[folder] = dims_from_config(ckpt.config, str(folder / "config.json"))
        check_target_fits(request.target, dims[folder])
        if folder == request.draft and "quantization_config" not in ckpt.config:
            raise InputError(
                f"{request.draft}: has no quantization_config; pass the FP8 draft to validate"
            )
    if request.against is not None:
        check_comparable(request.against, request.k)
    install = probe_vllm(sys.executable)
    check_engine_args(request.engine.engine_args, install.engine_args)
    check_kv_cache_dtype(request.draft_kv_cache_dtype, install, kv_source(request.draft))
    check_attention_backend(request.draft_attention_backend, install, "--draft-attention-backend")
    if request.hidden_states is not None:
        check_capture(request.hidden_states, dims[request.baseline])
    else:
        check_engine(request.capture)
    return files


def validate_draft(
    request: ValidateRequest,
    progress: Any = lambda _m: None,
    reuse: dict[str, EngineRun] | None = None,
) -> ValidationReport:
    """Run the three engines (or reuse finished ``target``/``bf16`` runs) and the six checks."""
    asked = request.draft_kv_cache_dtype
    kv = draft_kv_cache_dtype(asked, read_checkpoint(request.draft).config)
    if kv != asked:
        progress(f"the draft carries calibrated K/V scales: its KV cache runs in {kv}")
        request = replace(request, draft_kv_cache_dtype=kv)
    files = check_inputs(request)
    rendered = engine_prompts(request)
    engines: dict[str, EngineRun] = dict(reuse or {})

    def run_one(draft: Path | None) -> EngineRun:
        kv = request.draft_kv_cache_dtype if draft == request.draft else None
        return run_engine(request, draft, rendered, kv)

    roles = [("target", None), ("bf16", request.baseline), ("fp8", request.draft)]
    if not request.reference_engine and "target" not in engines:
        roles = roles[1:]  # check 1 from teacher-forced scores in the speculative engine
    missing = [(r, d) for r, d in roles if r not in engines]
    per_draft = request.engine_per_draft or request.draft_kv_cache_dtype is not None
    if missing and request.draft_kv_cache_dtype is not None and not request.engine_per_draft:
        progress("a draft KV-cache dtype is set: one engine per draft (a swap keeps the KV cache)")
    runner = run_per_draft if per_draft else partial(run_single, request, rendered)
    runs = runner(missing, run_one, progress)
    engines |= runs.engines
    unscored = _unscored(engines)
    if "target" not in engines and unscored:
        progress(f"{unscored}: a target-alone engine for check 1 instead")
        runs.engines["target"] = engines["target"] = run_one(None)
        runs.target_loads += 1
    checks = _engine_checks(request, engines)
    categories = _categories(request, engines)
    if categories is not None:
        checks += category_checks(categories)
    progress("scale plausibility ...")
    checks.append(scale_plausibility(request, engines.get("target", engines["bf16"]), rendered))
    if request.against is not None:
        checks += _regression(request, engines["fp8"])
    fp8 = engines["fp8"].get("result")
    return ValidationReport(
        target=str(request.target),
        draft=str(request.draft),
        baseline=str(request.baseline),
        k=request.k,
        prompts=len(request.prompts),
        max_tokens=request.max_tokens,
        backend=fp8["platform"] if fp8 else "unknown",
        plugin_active=bool(fp8 and fp8["plugin_active"]),
        engines={role: _engine_summary(e) for role, e in engines.items()},
        checks=checks,
        prompts_sha256=prompts_digest(request.prompts),
        serve_command=fp8["engine_config"]["serve_line"] if fp8 else None,
        files=files,
        command=request.command,
        environment=environment(),
        chat_template=rendered.chat_template,
        prompt_set=request.prompt_set,
        calibration_overlap=calibration_overlap(request.draft, request.prompts),
        categories=categories,
        min_category_drafts=request.min_category_drafts if request.categories else None,
        prompt_categories=request.categories,
        engine_mode=runs.mode,
        target_loads=runs.target_loads + (request.hidden_states is None),
        load_s=_total(runs.engines, "load_s"),
        generate_s=_total(runs.engines, "generate_s"),
        score_s=_total(runs.engines, "score_s"),
    )


def _categories(
    request: ValidateRequest, engines: dict[str, EngineRun]
) -> dict[str, dict[str, Any]] | None:
    """Acceptance by category for both drafts (None without categories or per-prompt counts)."""
    if request.categories is None or not all(engines[role]["ok"] for role in ROLES):
        return None
    try:
        counts = {role: prompt_counts(engines[role]["result"]) for role in ROLES}
    except ValueError:
        return None  # checks 2 and 5 already fail with the reason
    return by_category(
        request.categories,
        counts,
        min_drafts=request.min_category_drafts,
        thresholds=_thresholds(request),
        acceptance=acceptance,
    )


def _thresholds(request: ValidateRequest) -> AcceptanceThresholds:
    return AcceptanceThresholds(
        min_acceptance_ratio=request.min_acceptance_ratio,
        min_position_ratio=request.min_position_ratio,
        resamples=request.resamples,
        seed=request.seed,
    )


def engine_prompts(request: ValidateRequest) -> RenderedPrompts:
    """The prompts as every engine gets them: through the target's chat template, if asked."""
    return render_for_target(request.target, request.prompts, request.chat_template)


def calibration_overlap(draft: Path, prompts: list[str]) -> dict[str, Any] | None:
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


def _total(engines: dict[str, EngineRun], key: Literal["load_s", "generate_s", "score_s"]) -> float:
    """Seconds over this run's engines (a shared engine's load counted once, its swaps each)."""
    return round(sum(e["result"].get(key, 0.0) for e in engines.values() if "result" in e), 2)


def run_engine(
    request: ValidateRequest,
    draft: Path | None,
    rendered: RenderedPrompts | None = None,
    kv_cache_dtype: str | None = None,
) -> EngineRun:
    """One engine in a child process (own process group), bounded by the timeout; the draft's
    KV cache in ``kv_cache_dtype`` (None: the target's)."""
    rendered = rendered or engine_prompts(request)
    with tempfile.TemporaryDirectory(prefix="eaglequant-engine-") as scratch:
        spec_path, out_path = Path(scratch) / "spec.json", Path(scratch) / "out.json"
        log_path = Path(scratch) / "engine.log"
        speculative = None
        if draft:
            speculative = speculative_config(
                str(draft),
                request.k,
                kv_cache_dtype,
                attention_backend=request.draft_attention_backend,
            )
        spec = {
            "llm": llm_kwargs(request.engine, str(request.target), speculative),
            "prompts": rendered.texts,
            "add_special_tokens": rendered.add_special_tokens,
            "max_tokens": request.max_tokens,
            "logprobs": None if draft else TOP_LOGPROBS,
            TEACHER_FORCED_KEY: TEACHER_FORCED_RANKS if draft else None,
        }
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ)
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        argv = [sys.executable, "-m", "eaglequant.validate.engine_run", str(spec_path)]
        ended = run_child([*argv, str(out_path)], log_path, env, request.engine_timeout_s)
        log_text = log_path.read_text(encoding="utf-8", errors="replace")
        engine: EngineRun = {
            "ok": ended.ok and out_path.is_file(),
            "returncode": ended.returncode,
            "timed_out": ended.timed_out,
            "wall_s": ended.wall_s,
            "log": log_text,
        }
        if engine["ok"]:
            engine["result"] = read_engine_result(out_path)
        return engine


def _engine_summary(engine: EngineRun) -> dict[str, Any]:
    summary: dict[str, Any] = {k: engine[k] for k in ("ok", "returncode", "timed_out", "wall_s")}
    result = engine.get("result")
    if result is not None:
        summary |= {
            k: result[k]
            for k in ("load_s", "generate_s", "swapped", "metrics", "kernels", "engine_config")
            if k in result
        }
        summary["acceptance"] = acceptance(result["metrics"])
        if result["per_request"] is not None:
            summary["per_prompt"] = result["per_request"]
        summary["outputs_sha256"] = outputs_digest(result["token_ids"])
        summary["token_ids"] = result["token_ids"]
    if not engine["ok"]:
        summary["log_tail"] = log_tail(engine["log"])
    return summary


def outputs_digest(token_ids: list[list[int]]) -> str:
    """One hash of every generated token id: equal hashes, equal greedy outputs (any machine)."""
    import hashlib

    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()


def acceptance(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Mean acceptance length (1 + accepted / drafts, as vLLM's example) and per position."""
    drafts = metrics.get("num_drafts", 0)
    accepted = metrics.get("num_accepted_tokens", 0)
    per_pos = metrics.get("accepted_per_pos", [])
    return {
        "mean_length": 1 + accepted / drafts if drafts else None,
        "per_position": [a / drafts for a in per_pos] if drafts else [],
        "drafts": drafts,
        "accepted": accepted,
    }


def _unscored(engines: dict[str, EngineRun]) -> str | None:
    """Why check 1 cannot come from teacher-forced scores (None: both drafts' runs have them)."""
    for role in ROLES:
        result = engines[role].get("result")
        if engines[role]["ok"] and result is not None and TEACHER_FORCED_KEY not in result:
            return f"the {role} run has no teacher-forced scores (this vLLM gave none)"
    return None


def _lossless(request: ValidateRequest, engines: dict[str, EngineRun]) -> Check:
    """Check 1: against the target-alone engine when it ran, else teacher-forced."""
    results = {role: engines[role]["result"] for role in ROLES}
    if "target" in engines:
        target = engines["target"]["result"]
        return lossless_check(
            target["token_ids"],
            target["top_logprobs"],
            {role: r["token_ids"] for role, r in results.items()},
            request.lossless,
            request.tie_margin,
        )
    scored = {role: (r["token_ids"], r.get("teacher_forced", [])) for role, r in results.items()}
    return teacher_forced_check(scored, request.lossless, request.tie_margin)


def _engine_checks(request: ValidateRequest, engines: dict[str, EngineRun]) -> list[Check]:
    failed = [role for role, e in engines.items() if not e["ok"]]
    if failed:
        tails = {role: log_tail(engines[role]["log"]) for role in failed}
        causes = ", ".join(f"{role}: {_exit_cause(engines[role])}" for role in failed)
        return [
            Check(
                "engines",
                False,
                f"vLLM engine(s) {failed} failed or timed out ({causes}; "
                f"timeout {request.engine_timeout_s:.0f}s); see log_tail",
                {"log_tail": tails},
            )
        ]
    acceptance_check, per_position = engine_acceptance_checks(engines, _thresholds(request))
    return [
        _lossless(request, engines),
        acceptance_check,
        layers_check(
            engines["fp8"]["result"]["draft_layers"],
            expected_schemes(request.draft),
            kv_cache=(
                engines["fp8"]["result"].get("draft_attention", []),
                checkpoint_kv_scales(request.draft),
            ),
        ),
        _log_check(engines["fp8"]["log"]),
        per_position,
    ]


def _exit_cause(engine: EngineRun) -> str:
    return ChildRun(engine["returncode"], engine["timed_out"], engine["wall_s"]).cause()


def expected_schemes(draft: Path) -> dict[str, str | None]:
    """Each draft-layer linear, named within the layer (vLLM's layer index differs between its
    weights and its modules), with the Quark scheme inspect predicts vLLM builds it with
    (None: BF16, as an MLA draft's ``self_attn.kv_b_proj``)."""
    fates = predict_fates(read_checkpoint(draft).config)
    return {
        f.vllm_name.split(".", 3)[3]: f.vllm_scheme if f.quantized else None
        for f in fates
        if ".layers." in f.vllm_name
    }


def checkpoint_kv_scales(draft: Path) -> list[tuple[float, float]]:
    """The draft's calibrated (K, V) scales, one pair per attention in layer order (none: [])."""
    ckpt = read_checkpoint(draft)

    def scalar(name: str) -> float:
        return float(ckpt.load_tensor(name).float().reshape(-1)[0])

    return [
        (scalar(k), scalar(v))
        for k, v in kv_scale_pairs(dims_from_config(ckpt.config).linears)
        if k in ckpt.tensors and v in ckpt.tensors
    ]


def kv_cache_problems(
    attention: list[DraftAttention], scales: list[tuple[float, float]]
) -> tuple[list[str], str]:
    """vLLM's drafter attention against the checkpoint's K/V scales: problems, and a note."""
    fp8 = [a for a in attention if a["kv_cache_dtype"].startswith("fp8")]
    if scales and not attention:  # nothing observed: the K/V scales cannot be said to be held
        return [
            f"vLLM reported no drafter attention layer for the checkpoint's {len(scales)} K/V "
            "scale pair(s)"
        ], ""
    if not scales:
        return [], " (draft KV cache FP8 with K/V scales 1.0: none calibrated)" if fp8 else ""
    if not fp8:
        dtypes = sorted({a["kv_cache_dtype"] for a in attention}) or ["unknown"]
        return [], f" (the checkpoint's K/V scales unused: draft KV cache {'/'.join(dtypes)})"
    problems = []
    if len(fp8) != len(scales):
        problems.append(f"{len(fp8)} FP8 draft attention layers for {len(scales)} K/V scale pairs")
    for layer, (k, v) in zip(fp8, scales, strict=False):
        held = (layer["k_scale"], layer["v_scale"])
        if not all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(held, (k, v), strict=True)):
            problems.append(
                f"{layer['name']} holds K/V scales {held[0]:.6g}/{held[1]:.6g}, "
                f"the checkpoint {k:.6g}/{v:.6g}"
            )
    return problems, f"; FP8 draft KV cache with the checkpoint's K/V scales ({len(scales)})"


def layers_check(
    layers: list[DraftLayer],
    expected: dict[str, str | None],
    kv_cache: tuple[list[DraftAttention], list[tuple[float, float]]] = ([], []),
) -> Check:
    """vLLM's drafter as built: fc, lm_head unquantized, every draft-layer linear with the
    scheme ``expected`` names for it (None: unquantized) and finite positive scales (E8M0
    exponent bytes: none NaN); with ``kv_cache`` (vLLM's drafter attention, the checkpoint's
    K/V scales), an FP8 draft KV cache holding the checkpoint's scales."""
    problems, kv_note = kv_cache_problems(*kv_cache)
    problems += unobserved(layers, expected)
    for layer in layers:
        name, method = layer["name"], layer["quant_method"]
        within = name.split(".", 3)[3] if ".layers." in name else None
        if name in ("model.fc", "lm_head", "model.embed_tokens") or (
            within is not None and expected.get(within, "QuarkW8A8Fp8") is None
        ):
            if not method.startswith("Unquantized") or layer["weight_dtype"] == "float8_e4m3fn":
                problems.append(
                    f"{name} built as {layer['scheme'] or method} ({layer['weight_dtype']})"
                )
            continue
        if within is None:
            continue
        scheme = expected.get(within, "QuarkW8A8Fp8")
        if layer["scheme"] != scheme or layer["weight_dtype"] not in QUANTIZED_WEIGHT_DTYPES:
            problems.append(
                f"{name} built as {layer['scheme'] or method} ({layer['weight_dtype']}), "
                f"expected {scheme}"
            )
        for scale in SCALE_NAMES:
            if scale in layer and not _scale_ok(layer[scale]):
                problems.append(f"{name}.{scale} not finite positive ({layer[scale]})")
    schemes = sorted({s for s in expected.values() if s is not None})
    kept = sorted(k for k, s in expected.items() if s is None)
    detail = (
        f"fc, lm_head unquantized; every draft layer's projections {'/'.join(schemes)} with "
        "finite positive scales"
    ) + (f" but for {', '.join(kept)} (BF16 as predicted)" if kept else "")
    detail += kv_note
    if problems:
        detail = "; ".join(problems)
    return Check("3 layers", not problems, detail, {"layers": layers, "attention": kv_cache[0]})


def unobserved(layers: list[DraftLayer], expected: dict[str, str | None]) -> list[str]:
    """What check 3 expected to see and vLLM did not report: no layer at all, a predicted
    draft-layer linear, or any scale on the quantized ones (nothing observed never passes)."""
    if not layers:
        return ["vLLM reported no drafter linear layer (nothing observed)"]
    seen = {layer["name"].split(".", 3)[3] for layer in layers if ".layers." in layer["name"]}
    missing = sorted(w for w in expected if w not in seen)
    problems = [f"vLLM reported no {', '.join(missing)} in any draft layer"] if missing else []
    quantized = [
        layer
        for layer in layers
        if ".layers." in layer["name"] and expected.get(layer["name"].split(".", 3)[3])
    ]
    if quantized and not any(scale in layer for layer in quantized for scale in SCALE_NAMES):
        problems.append(
            f"vLLM reported no weight or input scale on any of the {len(quantized)} quantized "
            "draft linears (nothing observed)"
        )
    return problems


QUANTIZED_WEIGHT_DTYPES = ("float8_e4m3fn", "uint8")  # FP8 and MXFP8; MXFP4's packed bytes


def _scale_ok(scale: ScaleStats) -> bool:
    if scale.get("dtype") == "uint8":  # E8M0 exponent bytes: 255 is NaN
        return bool(scale["max"] < E8M0_NAN)
    return bool(scale["finite_positive"])


def _log_check(log: str) -> Check:
    if not log.strip():
        return Check("4 engine log", False, "the FP8 engine wrote no log: nothing to check", {})
    hits = [
        line.strip()
        for line in log.splitlines()
        if BAD_EXCLUSION_SIGNATURE in line and "float8" in line
    ]
    detail = "no FP8 load warnings" if not hits else f"{len(hits)} warning(s): {hits[0][:300]}"
    return Check("4 engine log", not hits, detail, {"warnings": hits[:10]})


def _regression(request: ValidateRequest, fp8: EngineRun) -> list[Check]:
    """Check 7 on this run's FP8 engine against the earlier report's, and per category when
    both runs have categories."""
    assert request.against is not None
    try:
        counts = prompt_counts(fp8["result"]) if fp8["ok"] else None
    except ValueError as exc:
        return [Check(REGRESSION, False, str(exc))]
    if counts is None:
        return [Check(REGRESSION, False, "the FP8 engine did not finish: nothing to compare")]
    current = RunCounts(
        source="this run",
        k=request.k,
        max_tokens=request.max_tokens,
        prompts_sha256=prompts_digest(request.prompts),
        outputs_sha256=outputs_digest(fp8["result"]["token_ids"]),
        per_prompt=tuple(counts),
        categories=tuple(request.categories) if request.categories else None,
    )
    checks = [
        regression_check(
            current,
            request.against,
            max_regression=request.max_regression,
            resamples=request.resamples,
            seed=request.seed,
        )
    ]
    by_category = category_regression(
        current,
        request.against,
        min_drafts=request.min_category_drafts,
        max_regression=request.max_regression,
        resamples=request.resamples,
        seed=request.seed,
    )
    return checks if by_category is None else [*checks, by_category]


def scale_plausibility(
    request: ValidateRequest, target_engine: EngineRun, rendered: RenderedPrompts
) -> Check:
    """Check 6 on the validation sequences: each prompt and the target's own continuation
    (``target_engine``'s outputs: the target alone's, or the BF16 draft run's, which check 1
    proves are the target's greedy outputs)."""
    from eaglequant.validate.plausibility import PlausibilityInputs
    from eaglequant.validate.plausibility import scale_plausibility as check

    target_result = target_engine.get("result")
    inputs = PlausibilityInputs(
        target=request.target,
        draft=request.draft,
        baseline=request.baseline,
        prompts=rendered.texts,
        add_special_tokens=rendered.add_special_tokens,
        generated=target_result["token_ids"] if target_result else None,
        k=request.k,
        tolerance=request.scale_tolerance,
        capture=request.capture
        if request.capture.timeout_s is not None
        else replace(request.capture, timeout_s=request.engine_timeout_s),
        hidden_states=request.hidden_states,
    )
    try:
        return check(inputs)
    except EngineFailed as exc:
        return Check(
            "6 scale plausibility", False, f"could not capture the target's hidden states: {exc}"
        )
