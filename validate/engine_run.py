"""One vLLM engine configuration in its own process.

Run as ``python -m eaglequant.validate.engine_run SPEC OUT`` (:mod:`eaglequant.engine.child`).

SPEC is a JSON file: ``llm`` (the ``vllm.LLM`` keyword arguments from
``eaglequant.engine.config.llm_kwargs``), prompts, whether their tokenization
adds special tokens (not for chat-templated prompts), max_tokens and the
number of top logprobs to record (None for none). The process applies the platform's
defaults (CPU only: eager mode, KV cache space, thread binding), starts an
offline ``vllm.LLM`` (greedy), answers the first turns of any second turns it is asked
(``second_turns``: measured after the prompts), generates (then, when asked, once per
sampling seed at a temperature), and writes OUT (an
:class:`~eaglequant.results.engine_result.EngineResult`, with its schema version) with the token ids
(and top logprobs), the spec-decode counters from ``LLM.get_metrics()`` and,
for a speculative run, each prompt's own (``per_request``: vLLM's
per-request histogram of accepted draft tokens per verify step), how
vLLM built each draft layer (asked of the workers through a worker
extension), which vLLM kernel library the process loaded, the exact engine
configuration, and timings. vLLM loads its own kernels: nothing here imports a
compiled extension.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, TypedDict, cast

from eaglequant.engine import vllm_internals
from eaglequant.engine.child import VLLM_PRELOAD, EngineChild, die_on_fatal_signals
from eaglequant.engine.child_request import EngineRequest, EngineRequestJson
from eaglequant.engine.config import platform_defaults, platform_env, usable_cores, worker_count
from eaglequant.engine.cpu_fp8_plugin import ACTIVE_ENV, failed_patches
from eaglequant.engine.introspection import engine_record, loaded_kernel_libraries
from eaglequant.engine.swap import swap_draft
from eaglequant.results.engine_result import (
    ENGINE_RESULT_SCHEMA,
    SCALE_NAMES,
    DraftAttention,
    DraftLayer,
    EngineResult,
    Generated,
    LinearRange,
    RequestCounts,
    SampledRun,
    SpecMetrics,
    TopLogprobs,
)
from eaglequant.results.spec_counts import VLLM_KEYS, SpecDecodeCounts
from eaglequant.rules.speculative import SpeculativeDict
from eaglequant.validate.draft_ranges import collect, watch
from eaglequant.validate.lossless import RAW_LOGITS
from eaglequant.validate.second_turns import answer_first_turns

if TYPE_CHECKING:
    from eaglequant.engine.swap import SwapOutcome

PRELOAD = VLLM_PRELOAD  # imported once by a fork server
SPEC_METRICS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_pos",
    # Prompt tokens looked up in / served from the prefix cache: a run after a draft swap
    # must serve none from blocks the previous draft wrote.
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
}


def draft_layers(worker: Any) -> list[DraftLayer]:
    """On the worker: every linear of the draft, with its quant method, scheme and scales."""
    # lazy: torch-free core
    import torch

    layers = []
    for name, module in vllm_internals.draft_model(worker).named_modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if method is None or not isinstance(weight, torch.Tensor):
            continue
        scheme = getattr(module, "scheme", None)
        entry: DraftLayer = {
            "name": name,
            "module": type(module).__name__,
            "quant_method": type(method).__name__,
            "scheme": type(scheme).__name__ if scheme is not None else None,
            "weight_dtype": str(weight.dtype).removeprefix("torch."),
        }
        for scale_name in SCALE_NAMES:
            scale = getattr(module, scale_name, None)
            if isinstance(scale, torch.Tensor):
                values = scale.detach().float().flatten()
                entry[scale_name] = {
                    "dtype": str(scale.dtype).removeprefix("torch."),
                    "count": values.numel(),
                    "min": float(values.min()),
                    "max": float(values.max()),
                    "finite_positive": bool(torch.isfinite(values).all() and (values > 0).all()),
                }
        layers.append(entry)
    return layers


def draft_attention(worker: Any) -> list[DraftAttention]:
    """On the worker: every attention layer of the draft, its KV cache dtype and K/V scales."""
    found: list[DraftAttention] = []
    model = vllm_internals.draft_model(worker)
    for name, module in vllm_internals.attention_layers(model):
        if not hasattr(module, "kv_cache_dtype"):
            continue  # not a KV-cached attention (none in an EAGLE-3 draft)
        k_scale, v_scale = vllm_internals.kv_scales(module)
        found.append(
            {
                "name": name,
                "kv_cache_dtype": str(module.kv_cache_dtype),
                "k_scale": k_scale,
                "v_scale": v_scale,
            }
        )
    return found


def metrics_delta(after: SpecMetrics, before: SpecMetrics) -> SpecMetrics:
    """The counters over one run: ``after`` less ``before`` (the spec-decode ones as
    :class:`SpecDecodeCounts`, when the engine speculated; the prefix cache's as numbers)."""
    delta: dict[str, Any] = {
        key: value - before.get(key, 0)  # type: ignore[operator]
        for key, value in after.items()
        if key not in VLLM_KEYS
    }
    if any(key in after for key in VLLM_KEYS):
        spent = SpecDecodeCounts.from_vllm(after) - SpecDecodeCounts.from_vllm(before)
        delta |= spent.to_vllm()
    return cast(SpecMetrics, delta)


def spec_metrics(llm: Any) -> SpecMetrics:
    """The spec-decode and prefix-cache counters ``llm`` has counted so far (cumulative)."""
    found: dict[str, int | list[int]] = {}  # keyed by SPEC_METRICS' values, SpecMetrics' fields
    for metric in llm.get_metrics():
        key = SPEC_METRICS.get(metric.name)
        if key is None:
            continue
        if hasattr(metric, "values"):
            found[key] = [int(v) for v in metric.values]
        else:
            found[key] = int(metric.value)
    return cast(SpecMetrics, found)


class DraftInspector:
    """Worker extension (``worker_extension_cls``): what the tool asks every worker by name.

    Methods are called with ``collective_rpc("eaglequant_…")``, so no callable is
    pickled to worker processes (tensor parallelism, a separate engine core).
    """

    def eaglequant_draft_layers(self) -> list[DraftLayer]:
        return draft_layers(self)

    def eaglequant_draft_attention(self) -> list[DraftAttention]:
        return draft_attention(self)

    def eaglequant_swap_draft(self, speculative: SpeculativeDict) -> SwapOutcome:
        return swap_draft(self, speculative)

    def eaglequant_watch_ranges(self) -> int:
        return watch(self)

    def eaglequant_draft_ranges(self) -> dict[str, LinearRange]:
        return collect(self)

    def eaglequant_plugin_active(self) -> bool:
        return os.environ.get(ACTIVE_ENV) == "1"


def run(spec: EngineRequestJson) -> EngineResult:
    """In the engine child: the engine ``spec`` asks for (an :class:`EngineRequest`), its run."""
    request = EngineRequest.from_json(spec)
    started = time.perf_counter()
    llm, kwargs = open_llm(request)
    loaded = time.perf_counter()
    request, answered = answer_first_turns(llm, request, kwargs)
    answered_metrics = spec_metrics(llm) if answered else {}
    began = time.perf_counter()
    result = generate(llm, request, kwargs)
    if answered:  # the answers' counts are not the measured run's
        result["metrics"] = metrics_delta(result["metrics"], answered_metrics)
    finished: EngineResult = {
        **result,
        "load_s": round(loaded - started, 2),
        "generate_s": round(time.perf_counter() - began, 2),
    }
    if answered:
        finished["second_turns"] = answered
    return finished


def require_cpu_patches() -> None:
    """eaglequant's engines need every patch of the CPU plugin: refuse, in one line, where one
    was not applied (its own log line says why)."""
    # lazy: vllm is an optional extra
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    failed = failed_patches()
    if failed:
        raise SystemExit(
            f"eaglequant CPU plugin: {', '.join(failed)} not applied in this vLLM (see the log "
            "line naming it); eaglequant's engines need it: use a vLLM the plugin was read "
            "against (docs/verification.md)"
        )


def open_llm(request: EngineRequest) -> tuple[Any, dict[str, Any]]:
    """The offline engine for ``request.llm`` with the platform's defaults, and its arguments."""
    # lazy: vllm is an optional extra
    from vllm import LLM
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu:
        require_cpu_patches()
    kwargs = platform_defaults(request.llm, on_cpu)
    os.environ.update(platform_env(os.environ, on_cpu, worker_count(kwargs), usable_cores()))
    speculative = kwargs.get("speculative_config") is not None
    llm = LLM(
        **kwargs,
        disable_log_stats=False,
        per_request_spec_decode_metrics="summary" if speculative else "none",
        worker_extension_cls="eaglequant.validate.engine_run.DraftInspector",
        # check 1's teacher-forced scores as the target's raw (BF16) logits: their differences
        # are the logprobs' and their size gives a tie's rounding step (not recorded: it
        # changes only what is returned, never what is generated)
        **({"logprobs_mode": RAW_LOGITS} if speculative and request.teacher_forced else {}),
    )
    die_on_fatal_signals()  # after vLLM's imports installed their handlers
    return llm, kwargs


def generate(llm: Any, request: EngineRequest, kwargs: dict[str, Any]) -> Generated:
    """Greedy outputs of the request's prompts and what the engine reports (cumulative metrics,
    before the sampled runs the request asks for)."""
    # lazy: vllm is an optional extra
    from vllm import SamplingParams
    from vllm.platforms import current_platform

    params = SamplingParams(
        temperature=0.0,
        max_tokens=request.max_tokens,
        ignore_eos=True,
        logprobs=request.logprobs,
    )
    speculative = kwargs.get("speculative_config") is not None
    ranged = speculative and request.draft_ranges
    if ranged:
        llm.collective_rpc("eaglequant_watch_ranges")
    outputs = llm.generate(
        request.prompts,
        params,
        use_tqdm=False,
        tokenization_kwargs={"add_special_tokens": request.add_special_tokens},
    )
    scored: Scored = {}
    if ranged:  # the first worker that holds the draft (it runs at draft TP 1)
        scored["draft_ranges"] = next(
            (r for r in llm.collective_rpc("eaglequant_draft_ranges") if r), {}
        )
    if speculative and request.teacher_forced:
        began = time.perf_counter()
        scored["teacher_forced"] = teacher_forced(llm, outputs, request.teacher_forced)
        scored["teacher_forced_scores"] = RAW_LOGITS  # asked of the engine in open_llm
        scored["prompt_token_ids"] = [list(o.prompt_token_ids) for o in outputs]
        if request.control is not None:  # the control's tokens, scored by this engine's target
            scored["control_rescored"] = score_sequences(
                llm,
                request.control["prompt_token_ids"],
                request.control["token_ids"],
                request.teacher_forced,
            )
        scored["score_s"] = round(time.perf_counter() - began, 2)
    metrics = spec_metrics(llm)
    if speculative and request.sample_seeds:
        scored["sampled"] = sampled_runs(llm, request, metrics)
    return {
        "schema_version": ENGINE_RESULT_SCHEMA,
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "top_logprobs": [_top_logprobs(o.outputs[0].logprobs) for o in outputs],
        "texts": [o.outputs[0].text for o in outputs],
        "metrics": metrics,
        "per_request": [request_counts(o.outputs[0]) for o in outputs] if speculative else None,
        "draft_layers": llm.collective_rpc("eaglequant_draft_layers")[0] if speculative else [],
        "draft_attention": (
            llm.collective_rpc("eaglequant_draft_attention")[0] if speculative else []
        ),
        "platform": str(current_platform.device_type or "unknown"),
        "kernels": loaded_kernel_libraries(),
        "plugin_active": bool(llm.collective_rpc("eaglequant_plugin_active")[0]),
        "engine_config": engine_record(kwargs),
        **scored,
    }


class Scored(TypedDict, total=False):
    """What a run adds when asked: the draft linears' ranges, check 1's teacher-forced scores,
    the sampled runs."""

    draft_ranges: dict[str, LinearRange]
    teacher_forced: list[TopLogprobs]
    teacher_forced_scores: str
    prompt_token_ids: list[list[int]]
    control_rescored: list[TopLogprobs]
    score_s: float
    sampled: list[SampledRun]


def sampled_runs(llm: Any, request: EngineRequest, before: SpecMetrics) -> list[SampledRun]:
    """One run of the prompts per seed, sampled at the request's temperature (vLLM verifies the
    drafts by rejection sampling): prompt ``i`` of seed ``s`` seeded ``s * prompts + i``, so
    every prompt and seed draws its own stream, whatever the batch. Each run's counters are
    its own (the engine's after it less before it)."""
    # lazy: vllm is an optional extra
    from vllm import SamplingParams

    runs: list[SampledRun] = []
    for seed in request.sample_seeds:
        params = [
            SamplingParams(
                temperature=request.sample_temperature,
                seed=seed * len(request.prompts) + index,
                max_tokens=request.max_tokens,
                ignore_eos=True,
            )
            for index in range(len(request.prompts))
        ]
        began = time.perf_counter()
        outputs = llm.generate(
            request.prompts,
            params,
            use_tqdm=False,
            tokenization_kwargs={"add_special_tokens": request.add_special_tokens},
        )
        after = spec_metrics(llm)
        runs.append(
            {
                "temperature": request.sample_temperature,
                "seed": seed,
                "per_request": [request_counts(o.outputs[0]) for o in outputs],
                "metrics": metrics_delta(after, before),
                "generate_s": round(time.perf_counter() - began, 2),
            }
        )
        before = after
    return runs


def teacher_forced(llm: Any, outputs: Any, ranks: int) -> list[TopLogprobs]:
    """Each prompt with its own generated tokens, scored in one prefill of the same engine:
    per generated position the target's ``ranks`` best tokens and the generated one, by rank.

    The prefill is the target's forward pass alone (a draft proposes only after it), so a
    generated token ranked first there is the target's greedy choice given its prefix.
    """
    prompt_ids = [list(o.prompt_token_ids) for o in outputs]
    return score_sequences(llm, prompt_ids, [list(o.outputs[0].token_ids) for o in outputs], ranks)


def score_sequences(
    llm: Any, prompt_ids: list[list[int]], output_ids: list[list[int]], ranks: int
) -> list[TopLogprobs]:
    """Each prompt's tokens followed by its output's, scored in one prefill of the engine: per
    output position the target's ``ranks`` best tokens and the output's own, by rank."""
    # lazy: vllm is an optional extra
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [
        TokensPrompt(prompt_token_ids=[*prompt, *output])
        for prompt, output in zip(prompt_ids, output_ids, strict=True)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=ranks)
    scored = llm.generate(prompts, params, use_tqdm=False)
    return [
        _top_logprobs(s.prompt_logprobs[len(prompt) :])
        for prompt, s in zip(prompt_ids, scored, strict=True)
    ]


def request_counts(completion: Any) -> RequestCounts | None:
    """One prompt's verify steps: ``histogram[j]`` steps accepted ``j`` drafts, tokens drafted."""
    metrics = completion.spec_decode_metrics
    if metrics is None:
        return None
    return {
        "histogram": [int(c) for c in metrics.histogram],
        "num_draft_tokens": int(metrics.num_draft_tokens),
    }


def _top_logprobs(per_position: Any) -> TopLogprobs:
    """Per generated position: ``[[token, logprob], …]`` by rank (None when not requested)."""
    if per_position is None:
        return None
    return [
        [[int(t), float(lp.logprob)] for t, lp in sorted(pos.items(), key=lambda i: i[1].rank)]
        for pos in per_position
    ]


# The one entry point: the parent starts this child by importing it.
CHILD = EngineChild(run)

if __name__ == "__main__":
    CHILD.serve()
