"""``eaglequant validate``: prove an FP8 draft in vLLM speculative decoding against its BF16 draft.

The request and its input checks are ``request.py``. Both drafts run in child
processes with a timeout: by default served by one engine that swaps the draft
(``single_engine``: the target loaded once), else each in its own engine
(``engine_per_draft``); greedy, the same prompts and engine configuration
(``eaglequant.engine.config``: the target's parallelism, the user's engine
arguments, CPU-only defaults only on CPU). A target-alone engine runs only with
``reference_engine`` or where a run has no teacher-forced scores. Then six
checks, each reported with its numbers:

1. lossless (``lossless.py``): every generated token is the target's greedy
   choice given its prefix, scored teacher-forced in the run's own engine (or,
   with the target-alone engine, each run's tokens equal its tokens); a token
   nearly tied with the target's best passes unless ``lossless`` is ``strict``;
2. acceptance: the FP8/BF16 ratio of mean acceptance length, with a seeded
   paired-bootstrap 95% interval over prompts (``stats.py``): PASS when the
   interval clears the recipe's ratio, FAIL when it lies wholly below,
   otherwise INCONCLUSIVE (about how many prompts would decide);
3. and 4. (``layers.py``): vLLM built every draft model linear with the scheme
   ``inspect`` predicts and finite positive scales; the engine log names no FP8
   weight it could not load (a bad exclusion);
5. per-position acceptance: each position's FP8/BF16 acceptance-rate ratio,
   judged as check 2 against the recipe's per-position ratio (checks 2 and 5, with a
   ``temperature``, on runs sampled after each greedy one: ``acceptance.judged_counts``);
6. scale plausibility, outside vLLM (``plausibility.py``): every quantized weight
   dequantized against the BF16 baseline's, and every static input and K/V scale on the
   values the BF16 draft's linears see in its engine (else captured and replayed),
   each against what a calibrated scale does to the same values: fails on clipping,
   underflow or weight error beyond the recipe's factor, or on a missing scale;
7. regression (``--against`` an earlier report): this FP8 run's acceptance
   against the earlier one's (``regression.py``).

INCONCLUSIVE counts as not passed. The report (``to_json``) carries its kind
and schema version (``eaglequant.results.validation_report``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Literal

from eaglequant.engine.child_request import ControlTokens, EngineRequest
from eaglequant.engine.config import check_kv_cache_dtype, llm_kwargs, probe_vllm
from eaglequant.engine.process import ChildRun, log_tail, run_engine_child
from eaglequant.errors import EngineFailed, InputError
from eaglequant.progress import Progress, quiet
from eaglequant.prompts.chat import RenderedPrompts
from eaglequant.prompts.format import read_prompts as read_prompts
from eaglequant.results.engine_result import (
    EngineRun,
    read_engine_result,
)
from eaglequant.results.environment import environment
from eaglequant.results.validation_report import (
    CategoryRow,
    Check,
    CheckId,
    ValidationReport,
    prompts_digest,
)
from eaglequant.rules.speculative import draft_kv_cache_dtype, kv_source, speculative_config
from eaglequant.validate import engine_run
from eaglequant.validate.acceptance_checks import (
    AcceptanceThresholds,
    engine_acceptance_checks,
    judged_counts,
    prompt_counts,
)
from eaglequant.validate.categories import (
    ROLES,
    by_category,
    category_checks,
    category_regression,
)
from eaglequant.validate.engine_summary import engine_summary, outputs_digest
from eaglequant.validate.layers import (
    checkpoint_kv_scales,
    expected_schemes,
    layers_check,
    log_check,
)
from eaglequant.validate.lossless import (
    RAW_LOGITS,
    TEACHER_FORCED_RANKS,
    TOP_LOGPROBS,
    lossless_check,
    teacher_forced_check,
)
from eaglequant.validate.plausibility import CAPTURED_RANGES, PlausibilityInputs
from eaglequant.validate.plausibility import scale_plausibility as plausibility_check
from eaglequant.validate.prompt_lengths import check_prompt_lengths
from eaglequant.validate.regression import NAME as REGRESSION
from eaglequant.validate.regression import RunCounts, regression_check
from eaglequant.validate.request import (
    CheckedInputs,
    ValidateRequest,
    calibration_overlap,
    check_inputs,
    engine_prompts,
)
from eaglequant.validate.second_turns import check_second_turn_lengths, measured_request
from eaglequant.validate.single_engine import run_per_draft, run_single


def validate_draft(
    request: ValidateRequest,
    progress: Progress = quiet,
    reuse: dict[str, EngineRun] | None = None,
) -> ValidationReport:
    """Run the three engines (or reuse finished ``target``/``bf16`` runs) and the six checks."""
    checked = check_inputs(request)
    asked = request.draft_kv_cache_dtype
    kv = draft_kv_cache_dtype(asked, checked.draft.flat_config)
    if kv != asked:
        check_kv_cache_dtype(kv, probe_vllm(sys.executable), kv_source(request.draft))
        progress(f"the draft carries calibrated K/V scales: its KV cache runs in {kv}")
        request = replace(request, draft_kv_cache_dtype=kv)
    rendered = engine_prompts(request)
    check_prompt_lengths(
        request.target,
        rendered,
        engine=request.engine,
        install=probe_vllm(sys.executable),
        source=request.prompt_set["source"] if request.prompt_set else "the prompts",
    )
    if rendered.second_turns is not None:
        check_second_turn_lengths(
            request.target,
            rendered,
            max_tokens=request.max_tokens,
            engine=request.engine,
            install=probe_vllm(sys.executable),
            source=request.prompt_set["source"] if request.prompt_set else "the prompts",
        )
    first_turns = request.prompts
    engines: dict[str, EngineRun] = dict(reuse or {})

    def run_one(draft: Path | None, control: ControlTokens | None) -> EngineRun:
        kv = request.draft_kv_cache_dtype if draft == request.draft else None
        return run_engine(request, draft, rendered, kv, control)

    roles = [("target", None), ("bf16", request.baseline), ("fp8", request.draft)]
    if not request.reference_engine and "target" not in engines:
        roles = roles[1:]  # check 1 from teacher-forced scores in the speculative engine
    missing = [(r, d) for r, d in roles if r not in engines]
    no_swap = probe_vllm(sys.executable).gate("draft swap")
    per_draft = request.engine_per_draft or request.draft_kv_cache_dtype is not None or no_swap
    if missing and request.draft_kv_cache_dtype is not None and not request.engine_per_draft:
        progress("a draft KV-cache dtype is set: one engine per draft (a swap keeps the KV cache)")
    elif missing and no_swap and not request.engine_per_draft:
        progress(f"{no_swap}: one engine per draft")
    runner = run_per_draft if per_draft else partial(run_single, request, rendered)
    runs = runner(missing, run_one, progress)
    engines |= runs.engines
    unscored = _unscored(engines)
    if "target" not in engines and unscored:
        progress(f"{unscored}: a target-alone engine for check 1 instead")
        runs.engines["target"] = engines["target"] = run_one(None, None)
        runs.target_loads += 1
    request = measured_request(request, rendered)  # the answered second turns after the prompts
    checks = _fail_closed(ENGINE_CHECKS, lambda: _engine_checks(request, checked, engines))
    categories = _categories(request, engines)
    if categories is not None:
        checks += _fail_closed(CATEGORY_CHECKS, lambda: category_checks(categories))
    progress("scale plausibility ...")
    [plausibility] = _fail_closed(
        (CheckId.SCALES,),
        lambda: [scale_plausibility(request, checked, engines, rendered.measured(), progress)],
    )
    checks.append(plausibility)
    if request.against is not None:
        checks += _fail_closed((REGRESSION,), lambda: _regression(request, engines["fp8"]))
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
        engines={role: engine_summary(e) for role, e in engines.items()},
        checks=checks,
        prompts_sha256=prompts_digest(request.prompts),
        serve_command=fp8["engine_config"]["serve_line"] if fp8 else None,
        files=checked.files,
        command=request.command,
        environment=environment(),
        chat_template=rendered.chat_template,
        prompt_set=request.prompt_set,
        calibration_overlap=calibration_overlap(request.draft, first_turns),
        categories=categories,
        min_category_drafts=request.min_category_drafts if request.categories else None,
        prompt_categories=request.categories,
        engine_mode=runs.mode,
        target_loads=runs.target_loads
        + (plausibility.numbers.get("ranges_from") == CAPTURED_RANGES),
        load_s=_total(runs.engines, "load_s"),
        generate_s=_total(runs.engines, "generate_s"),
        score_s=_total(runs.engines, "score_s"),
        temperature=request.temperature,
        sampling_seeds=list(request.sampling_seeds),
        second_turns=rendered.second_turns.record(len(first_turns))
        if rendered.second_turns
        else None,
    )


ENGINE_CHECKS = (
    CheckId.LOSSLESS,
    CheckId.ACCEPTANCE,
    CheckId.LAYERS,
    CheckId.ENGINE_LOG,
    CheckId.PER_POSITION,
)
CATEGORY_CHECKS = (CheckId.ACCEPTANCE_BY_CATEGORY, CheckId.PER_POSITION_BY_CATEGORY)


def _fail_closed(names: tuple[CheckId, ...], make: Callable[[], list[Check]]) -> list[Check]:
    """``make``'s checks; where it raises unexpectedly, each of ``names`` FAILs with the
    reason, so the report (and its JUnit file) is still written. Bad input still stops the
    run (exit 2)."""
    try:
        return make()
    except InputError:
        raise
    except Exception as exc:
        reason = f"could not be judged: unexpected {type(exc).__name__}: {exc}"
        return [Check(name, False, reason) for name in names]


def _categories(
    request: ValidateRequest, engines: dict[str, EngineRun]
) -> dict[str, CategoryRow] | None:
    """Acceptance by category for both drafts (None without categories or per-prompt counts)."""
    if request.categories is None or not all(engines[role]["ok"] for role in ROLES):
        return None
    try:
        counts = {role: judged_counts(engines[role]["result"]) for role in ROLES}
    except ValueError:
        return None  # checks 2 and 5 already fail with the reason
    return by_category(
        request.categories,
        counts,
        min_drafts=request.min_category_drafts,
        thresholds=_thresholds(request),
    )


def _thresholds(request: ValidateRequest) -> AcceptanceThresholds:
    return AcceptanceThresholds(
        min_acceptance_ratio=request.min_acceptance_ratio,
        min_position_ratio=request.min_position_ratio,
        resamples=request.resamples,
        seed=request.seed,
        temperature=request.temperature,
        sampling_seeds=request.sampling_seeds,
    )


def _total(engines: dict[str, EngineRun], key: Literal["load_s", "generate_s", "score_s"]) -> float:
    """Seconds over this run's engines (a shared engine's load counted once, its swaps each)."""
    return round(sum(e["result"].get(key, 0.0) for e in engines.values() if "result" in e), 2)


def run_engine(
    request: ValidateRequest,
    draft: Path | None,
    rendered: RenderedPrompts | None = None,
    kv_cache_dtype: str | None = None,
    control: ControlTokens | None = None,
) -> EngineRun:
    """One engine in a child process (own process group), bounded by the timeout; the draft's
    KV cache in ``kv_cache_dtype`` (None: the target's); ``control``: a control run's tokens
    for its target to score again after its own run (check 1)."""
    rendered = rendered or engine_prompts(request)
    speculative, scored = None, bool(draft) and not request.reference_engine
    if draft:
        speculative = speculative_config(
            str(draft),
            request.k,
            kv_cache_dtype,
            attention_backend=request.draft_attention_backend,
        )
    spec = EngineRequest(
        llm=llm_kwargs(request.engine, str(request.target), speculative),
        prompts=rendered.for_engine(),
        add_special_tokens=rendered.add_special_tokens,
        max_tokens=request.max_tokens,
        logprobs=None if draft else TOP_LOGPROBS,
        teacher_forced=TEACHER_FORCED_RANKS if scored else None,
        draft_ranges=bool(draft) and request.hidden_states is None,  # check 6
        sample_temperature=request.temperature if draft else 0.0,
        sample_seeds=list(request.sampling_seeds) if draft else [],
        second_turns=rendered.second_turns.pending() if rendered.second_turns else None,
        control=control if scored else None,
    )
    outcome = run_engine_child(
        engine_run.CHILD,
        spec.to_json(),
        read=read_engine_result,
        timeout=request.engine_timeout_s,
    )
    engine: EngineRun = {
        "ok": outcome.result is not None,
        "returncode": outcome.ended.returncode,
        "timed_out": outcome.ended.timed_out,
        "wall_s": outcome.ended.wall_s,
        "log": outcome.log,
    }
    if outcome.result is not None:
        engine["result"] = outcome.result
        if rendered.second_turns is not None:  # every later engine measures its conversations
            rendered.second_turns.adopt(outcome.result)
    return engine


def _unscored(engines: dict[str, EngineRun]) -> str | None:
    """Why check 1 cannot come from teacher-forced scores (None: both drafts' runs have them)."""
    for role in ROLES:
        result = engines[role].get("result")
        if engines[role]["ok"] and result is not None and "teacher_forced" not in result:
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
    logits = all(r.get("teacher_forced_scores") == RAW_LOGITS for r in results.values())
    steps = request.tie_steps if logits else None
    rescored = {
        role: r["control_rescored"] for role, r in results.items() if "control_rescored" in r
    }
    return teacher_forced_check(
        scored, request.lossless, request.tie_margin, steps, reference=ROLES[0], rescored=rescored
    )


def _engine_checks(
    request: ValidateRequest, checked: CheckedInputs, engines: dict[str, EngineRun]
) -> list[Check]:
    failed = [role for role, e in engines.items() if not e["ok"]]
    if failed:
        tails = {role: log_tail(engines[role]["log"]) for role in failed}
        causes = ", ".join(f"{role}: {_exit_cause(engines[role])}" for role in failed)
        return [
            Check(
                CheckId.ENGINES,
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
            expected_schemes(checked.draft),
            kv_cache=(
                engines["fp8"]["result"].get("draft_attention", []),
                checkpoint_kv_scales(checked.draft),
            ),
        ),
        log_check(engines["fp8"]["log"]),
        per_position,
    ]


def _exit_cause(engine: EngineRun) -> str:
    return ChildRun(engine["returncode"], engine["timed_out"], engine["wall_s"]).cause()


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
    request: ValidateRequest,
    checked: CheckedInputs,
    engines: Mapping[str, EngineRun],
    rendered: RenderedPrompts,
    progress: Callable[[str], None] = lambda _m: None,
) -> Check:
    """Check 6 on the validation sequences: the BF16 draft's linears as vLLM ran them in the
    BF16 engine (``draft_ranges``), else each prompt and the target's own continuation
    captured (the target alone's outputs, or the BF16 draft run's, which check 1 proves are
    the target's greedy outputs) and replayed through the draft module."""
    target_result = engines.get("target", engines["bf16"]).get("result")
    bf16_result = engines["bf16"].get("result")
    inputs = PlausibilityInputs(
        target=request.target,
        draft=checked.draft,
        baseline=checked.baseline,
        prompts=rendered.texts,
        add_special_tokens=rendered.add_special_tokens,
        generated=target_result["token_ids"] if target_result else None,
        k=request.k,
        tolerance=request.scale_tolerance,
        capture=request.capture
        if request.capture.timeout_s is not None
        else replace(request.capture, timeout_s=request.engine_timeout_s),
        hidden_states=request.hidden_states,
        engine_ranges=bf16_result.get("draft_ranges") if bf16_result else None,
    )
    try:
        return plausibility_check(inputs, progress)
    except EngineFailed as exc:
        return Check(CheckId.SCALES, False, f"could not capture the target's hidden states: {exc}")
