"""One prompt set's part of an engine run that served several sets' prompts at once."""

from __future__ import annotations

from typing import cast

from eaglequant.results.engine_result import EngineResult, EngineRun, SpecMetrics
from eaglequant.validate.acceptance_checks import prompt_counts
from eaglequant.validate.stats import PromptCounts, pooled_counts


def slice_run(run: EngineRun, start: int, stop: int) -> EngineRun:
    """One prompt set's part of an engine run over several sets' prompts: its prompts'
    outputs and per-prompt counts, and the spec-decode counters summed from those counts once
    the whole run's counts are held to vLLM's counters (else the engine's counters stay, and
    checks 2 and 5 fail with the reason). Prefix-cache counters belong to the whole run."""
    result = run.get("result")
    if result is None:
        return run
    part = cast(EngineResult, dict(result))
    part["token_ids"] = result["token_ids"][start:stop]
    part["top_logprobs"] = result["top_logprobs"][start:stop]
    part["texts"] = result["texts"][start:stop]
    if "teacher_forced" in result:
        part["teacher_forced"] = result["teacher_forced"][start:stop]
    if "prompt_token_ids" in result:
        part["prompt_token_ids"] = result["prompt_token_ids"][start:stop]
    if "control_rescored" in result:  # check 1: the control's prompts, in the same order
        part["control_rescored"] = result["control_rescored"][start:stop]
    if result["per_request"] is not None:
        part["per_request"] = result["per_request"][start:stop]
        try:
            prompt_counts(result)
        except ValueError:
            return cast(EngineRun, {**run, "result": part})
        counts = [PromptCounts.from_json(p) for p in part["per_request"] or [] if p is not None]
        part["metrics"] = cast(SpecMetrics, pooled_counts(counts).to_vllm())
    return cast(EngineRun, {**run, "result": part})
