"""``eaglequant acceptance``: one draft's mean acceptance length on one labelled workload.

One vLLM engine child (``engine_run``, as ``validate`` starts it: the same engine arguments,
prompts rendered the same way, answers generated to ``max_tokens``) serves the target with
the draft. The figure is vLLM's: 1 + accepted / drafts from its spec-decode counters, and per
draft position accepted there / drafts; each prompt's own counts (vLLM's per-request
histograms, held to the global counters) give a bootstrap interval over prompts
(``stats.bootstrap_length``). With a temperature, the runs sampled after the greedy one, one
per seed, are measured instead, each prompt's counts summed over its seeds. The result
carries its :class:`~eaglequant.results.workload.AcceptanceWorkload`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglequant.engine.child_request import EngineRequest
from eaglequant.engine.config import (
    EngineOptions,
    check_engine_args,
    check_kv_cache_dtype,
    llm_kwargs,
    probe_vllm,
)
from eaglequant.engine.process import log_tail, run_engine_child
from eaglequant.errors import EngineFailed, InputError
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.progress import Progress, quiet
from eaglequant.prompts.chat import render_for_target
from eaglequant.results.engine_result import EngineResult, read_engine_result
from eaglequant.results.spec_counts import AcceptanceRecord
from eaglequant.results.workload import MAX_TOKENS, AcceptanceWorkload, concurrency_of
from eaglequant.rules.draft import dims_from_config, structure_problems
from eaglequant.rules.speculative import draft_kv_cache_dtype, kv_source, speculative_config
from eaglequant.rules.target_fit import check_target_fits
from eaglequant.validate import engine_run
from eaglequant.validate.acceptance_checks import judged_counts
from eaglequant.validate.prompt_lengths import check_prompt_lengths
from eaglequant.validate.stats import DEFAULT_RESAMPLES, DEFAULT_SEED, Interval, bootstrap_length

ACCEPTANCE_KIND = "eaglequant.acceptance"
ACCEPTANCE_SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class AcceptanceRequest:
    target: Path
    draft: Path
    prompts: list[str]
    prompt_set: str  # the source as given, for the label
    prompts_sha256: str
    k: int = 3
    max_tokens: int = MAX_TOKENS
    chat_template: bool = True
    temperature: float = 0.0
    sampling_seeds: tuple[int, ...] = ()
    engine: EngineOptions = field(default_factory=EngineOptions)
    engine_timeout_s: float = 600.0
    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED

    @property
    def workload(self) -> AcceptanceWorkload:
        return AcceptanceWorkload(
            prompt_set=self.prompt_set,
            prompts=len(self.prompts),
            chat_template=self.chat_template,
            k=self.k,
            max_tokens=self.max_tokens,
            ignore_eos=True,  # engine_run generates every answer to max_tokens
            temperature=self.temperature,
            seeds=self.sampling_seeds,
            concurrency=concurrency_of(self.engine.engine_args),
        )


@dataclass(frozen=True, kw_only=True)
class AcceptanceMeasurement:
    """The mean acceptance length with its interval over prompts, per position, its counts."""

    workload: AcceptanceWorkload
    mean_length: Interval
    acceptance: AcceptanceRecord  # pooled over prompts (and seeds): vLLM's counters' figures
    prompts_sha256: str
    engine_config: Mapping[str, Any]

    def describe(self) -> str:
        rates = ", ".join(f"{r:.3f}" for r in self.acceptance.per_position)
        return (
            f"mean acceptance length {self.mean_length.describe()} (95% interval over "
            f"{self.mean_length.prompts} prompts)\nper position: {rates}\n"
            f"workload: {self.workload.describe()}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": ACCEPTANCE_KIND,
            "schema_version": ACCEPTANCE_SCHEMA,
            "workload": self.workload.to_json(),
            "mean_length": self.mean_length.to_json(),
            "acceptance": self.acceptance.to_json(),
            "prompts_sha256": self.prompts_sha256,
            "engine_config": dict(self.engine_config),
        }


def check_request(request: AcceptanceRequest) -> None:
    """Everything checkable before the engine starts."""
    # lazy: torch-free core
    from eaglequant.validate.request import check_sampling

    if not request.target.is_dir():
        raise InputError(f"{request.target}: no such target folder; pass the target model's folder")
    if not request.prompts:
        raise InputError(f"{request.prompt_set}: no prompts; give a prompt set with prompts in it")
    draft = read_checkpoint(request.draft)
    problems = [p for p in structure_problems(draft) if not p.loadable]
    if problems:
        raise InputError(str(problems[0]))
    check_target_fits(
        request.target, dims_from_config(draft.flat_config, str(request.draft / "config.json"))
    )
    check_sampling(request.temperature, request.sampling_seeds)
    check_engine_args(request.engine.engine_args, probe_vllm(sys.executable).engine_args)


def measure_acceptance(
    request: AcceptanceRequest, progress: Progress = quiet
) -> AcceptanceMeasurement:
    """One engine run of ``request``'s workload and the acceptance vLLM counted in it."""
    check_request(request)
    rendered = render_for_target(request.target, request.prompts, request.chat_template)
    check_prompt_lengths(
        request.target,
        rendered,
        engine=request.engine,
        install=probe_vllm(sys.executable),
        source=request.prompt_set,
    )
    # the draft's KV cache as validate, compare and tune run it: FP8 where it carries
    # calibrated K/V scales, else the target's
    kv = draft_kv_cache_dtype(None, read_checkpoint(request.draft).flat_config)
    check_kv_cache_dtype(kv, probe_vllm(sys.executable), kv_source(request.draft))
    if kv is not None:
        progress(f"the draft carries calibrated K/V scales: its KV cache runs in {kv}")
    spec = EngineRequest(
        llm=llm_kwargs(
            request.engine,
            str(request.target),
            speculative_config(str(request.draft), request.k, kv),
        ),
        prompts=rendered.texts,
        add_special_tokens=rendered.add_special_tokens,
        max_tokens=request.max_tokens,
        sample_temperature=request.temperature,
        sample_seeds=list(request.sampling_seeds),
    )
    progress(f"vLLM engine: {request.workload.describe()} ...")
    outcome = run_engine_child(
        engine_run.CHILD,
        spec.to_json(),
        read=read_engine_result,
        timeout=request.engine_timeout_s,
    )
    if outcome.result is None:
        raise EngineFailed(
            f"the vLLM engine {outcome.ended.cause()}; its log ends:\n{log_tail(outcome.log)}"
        )
    return measurement(request, outcome.result)


def measurement(request: AcceptanceRequest, result: EngineResult) -> AcceptanceMeasurement:
    """The acceptance of one engine child's result (greedy, or its sampled runs)."""
    try:
        prompts = judged_counts(result)
    except ValueError as exc:
        raise EngineFailed(f"the engine's spec-decode counts are unusable: {exc}") from exc
    pooled = sum((p.counts for p in prompts[1:]), prompts[0].counts)
    return AcceptanceMeasurement(
        workload=request.workload,
        mean_length=bootstrap_length(prompts, resamples=request.resamples, seed=request.seed),
        acceptance=pooled.acceptance(),
        prompts_sha256=request.prompts_sha256,
        engine_config=result["engine_config"],
    )
