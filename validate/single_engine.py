"""Serving every draft of a validation from one vLLM engine: the target loaded once for all.

``run_single`` starts one engine child (``python -m eaglequant.validate.single_engine
SPEC OUT``) with the first draft, generates, then for each next draft swaps it in
through the worker extension (``eaglequant.engine.swap``), resets the prefix
cache so no block the previous draft computed is read again, and generates
again. Asked for second turns (``EngineRequest.second_turns``), the engine first answers
the first turns with the first draft (``second_turns.answer_first_turns``) and every draft
measures the same conversations after the prompts. Each draft's result is an
``EngineResult`` (:mod:`eaglequant.results.engine_result`) as ``engine_run.run`` gives a fresh
engine's, with the spec-decode counters taken as the difference over its own run and its
engine configuration naming its own draft.

The target-alone reference still gets its own engine: vLLM has no per-request or
runtime switch that turns speculation off in an engine built with it (its only
"no speculation" setting, a per-batch-size schedule with k 0, is fixed when the
scheduler starts), and a reference served by the speculative engine's own
verification path would make the lossless check compare that path with itself.

Drafts whose configs differ in shape (read here before any engine starts), or a
swap the workers refuse (``SwapRefused``), fall back to one engine per draft,
with one line saying why. ``run_per_draft`` is that mode for every role.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglequant.engine.child import VLLM_PRELOAD, EngineChild
from eaglequant.engine.child_request import ControlTokens, EngineRequest, EngineRequestJson
from eaglequant.engine.config import llm_kwargs
from eaglequant.engine.introspection import engine_record
from eaglequant.engine.process import run_engine_child
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.output import write_text_atomic
from eaglequant.progress import Progress
from eaglequant.results.engine_result import (
    ENGINE_RESULT_SCHEMA,
    EngineResult,
    EngineRun,
    SharedRuns,
    SpecMetrics,
    read_shared_runs,
)
from eaglequant.results.validation_report import PER_DRAFT
from eaglequant.rules.draft import dims_from_config
from eaglequant.rules.speculative import SpeculativeDict, speculative_config
from eaglequant.validate.engine_run import generate, metrics_delta, open_llm, spec_metrics
from eaglequant.validate.lossless import TEACHER_FORCED_RANKS
from eaglequant.validate.second_turns import answer_first_turns

if TYPE_CHECKING:
    from eaglequant.prompts.chat import RenderedPrompts
    from eaglequant.validate.request import ValidateRequest

SINGLE = "single"  # engine_mode: the drafts swapped in one engine
PRELOAD = VLLM_PRELOAD  # imported once by a fork server
PARTIAL_KEY = "partial_path"  # the spec's file for the runs finished so far
# Config keys that must agree, besides the dimensions, for two drafts to share an engine.
SHARED_KEYS = ("architectures", "num_hidden_layers")

# One role's engine: its draft (None: the target alone) and the control run's tokens for it to
# score again (check 1), where a control ran before it.
RunOne = Callable[[Path | None, ControlTokens | None], EngineRun]


@dataclass
class EngineRuns:
    """The engines' results by role, the mode that ran, and how many times the target loaded."""

    engines: dict[str, EngineRun] = field(default_factory=dict)
    mode: str = PER_DRAFT
    target_loads: int = 0
    fallback: str | None = None


def run_per_draft(
    roles: Sequence[tuple[str, Path | None]],
    run_one: RunOne,
    progress: Progress,
    control: ControlTokens | None = None,
) -> EngineRuns:
    """One engine per role, each loading the target; every draft's engine after the control's
    (``control``, else the first draft role's run) scores the control's tokens again."""
    runs = EngineRuns(mode=PER_DRAFT)
    for role, draft in roles:
        progress(f"vLLM engine: {role} ...")
        runs.engines[role] = run_one(draft, control if draft is not None else None)
        runs.target_loads += 1
        _done(progress, role, runs.engines[role])
        if draft is not None and control is None:
            control = control_tokens(runs.engines[role])
    return runs


def control_tokens(engine: EngineRun | None) -> ControlTokens | None:
    """A control run's prompts and outputs as token ids (None: it has none to score)."""
    result = engine.get("result") if engine is not None else None
    if result is None or "prompt_token_ids" not in result:
        return None
    return {"prompt_token_ids": result["prompt_token_ids"], "token_ids": result["token_ids"]}


def run_single(
    request: ValidateRequest,
    rendered: RenderedPrompts,
    roles: Sequence[tuple[str, Path | None]],
    run_one: RunOne,
    progress: Progress,
) -> EngineRuns:
    """The target-alone role in its own engine, every draft role in one shared engine."""
    alone = [(r, d) for r, d in roles if d is None]
    drafts = [(r, d) for r, d in roles if d is not None]
    runs = run_per_draft(alone, run_one, progress)
    runs.mode = SINGLE
    refusal = swap_refusal([d for _, d in drafts]) if len(drafts) > 1 else None
    if refusal is None and drafts:
        progress(f"vLLM engine: {', '.join(r for r, _ in drafts)} in one engine ...")
        shared = run_shared(request, rendered, drafts)
        runs.target_loads += 1
        for role, engine in shared.items():
            runs.engines[role] = engine
            _done(progress, role, engine)
        refusal = next((e["refused"] for e in shared.values() if e.get("refused")), None)
    if refusal is not None:
        rest = [
            (r, d) for r, d in drafts if r not in runs.engines or runs.engines[r].get("refused")
        ]
        names = ", ".join(r for r, _ in rest)
        progress(f"single engine refused ({refusal}); separate engines for {names}")
        for role, _ in rest:
            runs.engines.pop(role, None)
        first = runs.engines.get(drafts[0][0])
        others = run_per_draft(rest, run_one, progress, control_tokens(first))
        runs.engines |= others.engines
        runs.target_loads += others.target_loads
        runs.fallback = refusal
    return runs


def swap_refusal(drafts: Sequence[Path]) -> str | None:
    """Why these drafts cannot be swapped in one engine (their configs differ in shape), or None."""
    first, *rest = drafts
    reference = _shape(first)
    for draft in rest:
        shape = _shape(draft)
        for key, value in reference.items():
            if shape[key] != value:
                return f"{draft} differs from {first} in {key}"
    return None


def _shape(draft: Path) -> dict[str, Any]:
    config = read_checkpoint(draft).flat_config
    shape = {k: config.get(k) for k in SHARED_KEYS}
    return shape | {"dimensions": dims_from_config(config, str(draft / "config.json"))}


def run_shared(
    request: ValidateRequest, rendered: RenderedPrompts, drafts: Sequence[tuple[str, Path]]
) -> dict[str, EngineRun]:
    """All ``drafts`` in one engine child, bounded by the engine timeout per draft."""
    spec = shared_spec(request, rendered, [d for _, d in drafts])
    outcome = run_engine_child(
        CHILD,
        spec.to_json(),
        read=read_shared_runs,
        timeout=request.engine_timeout_s * len(drafts),
        partial_key=PARTIAL_KEY,
    )
    ended, log, ok = outcome.ended, outcome.log, outcome.result is not None
    # The engine ended (a crash, a timeout) during a draft: the runs before it stand.
    done, kept = outcome.result, outcome.partial
    runs = (done or kept or {"runs": []})["runs"]
    if rendered.second_turns is not None and runs:
        rendered.second_turns.adopt(runs[0])  # every later engine measures its conversations
    engines: dict[str, EngineRun] = {}
    for index, (role, _) in enumerate(drafts):
        engine: EngineRun = {
            "ok": ok,
            "returncode": ended.returncode,
            "timed_out": ended.timed_out,
            "wall_s": ended.wall_s,
            "log": log,
            "shared_engine": True,
        }
        if index < len(runs):
            result = runs[index]
            engine |= {
                "ok": True,
                "result": result,
                "wall_s": round(result["load_s"] + result["generate_s"], 1),
            }
        elif done is not None:
            engine |= {"ok": False, "refused": done["refused"]}
        elif index > len(runs):
            # Not a fault of this draft's: it runs again in an engine of its own.
            engine |= {"refused": f"the shared engine ended during {drafts[len(runs)][0]}"}
        engines[role] = engine
    return engines


def shared_spec(
    request: ValidateRequest, rendered: RenderedPrompts, drafts: Sequence[Path]
) -> EngineRequest:
    """The engine child's input: the engine (built with the first draft), each draft, prompts
    as the target-alone run gets them."""
    backend = request.draft_attention_backend
    speculative = [speculative_config(str(d), request.k, attention_backend=backend) for d in drafts]
    return EngineRequest(
        llm=llm_kwargs(request.engine, str(request.target), speculative[0]),
        drafts=speculative,
        prompts=rendered.for_engine(),
        add_special_tokens=rendered.add_special_tokens,
        max_tokens=request.max_tokens,
        teacher_forced=None if request.reference_engine else TEACHER_FORCED_RANKS,
        draft_ranges=request.hidden_states is None,  # check 6 from these runs
        sample_temperature=request.temperature,
        sample_seeds=list(request.sampling_seeds),
        second_turns=rendered.second_turns.pending() if rendered.second_turns else None,
    )


def _done(progress: Progress, role: str, engine: EngineRun) -> None:
    if engine.get("refused"):
        return
    state = "ok" if engine["ok"] else "FAILED"
    progress(f"vLLM engine: {role} {state} ({engine['wall_s']:.0f}s)")


def run(spec: EngineRequestJson) -> SharedRuns:
    """In the engine child: each of the request's drafts in turn, swapped into one engine."""
    request = EngineRequest.from_json(spec)
    started = time.perf_counter()
    llm, kwargs = open_llm(request)
    ready = time.perf_counter()
    # The first draft's engine answers the first turns, once for every draft.
    request, answered = answer_first_turns(llm, request, kwargs)
    runs: list[EngineResult] = []
    before: SpecMetrics = spec_metrics(llm) if answered else {}
    for index, speculative in enumerate(request.drafts):
        load_s = ready - started
        if index:
            refused = _swap(llm, speculative)
            if refused is not None:
                return _shared_runs(runs, refused)
            load_s = time.perf_counter() - ready
        began = time.perf_counter()
        drafted = kwargs | {"speculative_config": speculative}
        generated = generate(llm, request, drafted)
        cumulative = generated["metrics"]
        result: EngineResult = {
            **generated,
            "metrics": metrics_delta(cumulative, before),
            "engine_config": engine_record(drafted),
            "load_s": round(load_s, 2),
            "generate_s": round(time.perf_counter() - began, 2),
            "swapped": bool(index),
        }
        if answered and not index:
            result["second_turns"] = answered
        before = spec_metrics(llm) if generated.get("sampled") else cumulative
        runs.append(result)
        if not index and "prompt_token_ids" in result:
            # check 1: every later draft's run scores the first's tokens again, as a per-draft
            # engine does (engine_run.generate), with the target as that draft left it
            first: ControlTokens = {
                "prompt_token_ids": result["prompt_token_ids"],
                "token_ids": result["token_ids"],
            }
            request = replace(request, control=first)
        if request.partial_path:  # where the parent reads them should the engine end early
            write_text_atomic(Path(request.partial_path), json.dumps(_shared_runs(runs, None)))
        ready = time.perf_counter()
    return _shared_runs(runs, None)


def _shared_runs(runs: list[EngineResult], refused: str | None) -> SharedRuns:
    return {"schema_version": ENGINE_RESULT_SCHEMA, "runs": runs, "refused": refused}


def _swap(llm: Any, speculative: SpeculativeDict) -> str | None:
    """Swap the draft on every worker and reset the prefix cache; why not, when refused."""
    answers = llm.collective_rpc("eaglequant_swap_draft", args=(speculative,))
    refused = next((a["reason"] for a in answers if not a["ok"]), None)
    if refused is not None:
        return refused
    if not llm.reset_prefix_cache():
        return "vLLM did not reset the prefix cache"
    return None


# The one entry point: the parent starts this child by importing it.
CHILD = EngineChild(run)

if __name__ == "__main__":
    CHILD.serve()
