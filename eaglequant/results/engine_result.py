"""The engine result: what a validate engine child writes, and what the parent reads back.

An engine child (``eaglequant.validate.engine_run``, or ``single_engine`` for
several drafts in one engine) writes one :class:`EngineResult` per run, with
:data:`ENGINE_RESULT_SCHEMA` in it; the parent reads it with
:func:`read_engine_result` (or :func:`read_shared_runs`) and wraps it in an
:class:`EngineRun` saying how the child ended. Torch-free: the parent never
imports vLLM to read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

from eaglequant.errors import InputError
from eaglequant.prompts.turns import AnsweredJson
from eaglequant.results.manifest import read_json_object

if TYPE_CHECKING:  # Python 3.11's; annotations stay strings at run time (3.10 too)
    from typing import NotRequired

# Bumped whenever a field changes meaning or goes away; the reader refuses other versions.
ENGINE_RESULT_SCHEMA = 1

ScaleName = Literal["weight_scale", "input_scale"]
SCALE_NAMES: tuple[ScaleName, ...] = ("weight_scale", "input_scale")


class ScaleStats(TypedDict):
    """One scale tensor of a draft model linear, as vLLM holds it."""

    dtype: str
    count: int
    min: float
    max: float
    finite_positive: bool


class DraftLayer(TypedDict):
    """One linear of the draft model as vLLM built it: its quant method, scheme and scales."""

    name: str
    module: str
    quant_method: str
    scheme: str | None
    weight_dtype: str
    weight_scale: NotRequired[ScaleStats]
    input_scale: NotRequired[ScaleStats]


class DraftAttention(TypedDict):
    """One attention layer of the draft model: its KV cache dtype and the K/V scales vLLM holds
    (1.0 where the checkpoint has none)."""

    name: str
    kv_cache_dtype: str
    k_scale: float
    v_scale: float


class RequestCounts(TypedDict):
    """One prompt's verify steps: ``histogram[j]`` steps accepted ``j`` drafts; tokens drafted."""

    histogram: list[int]
    num_draft_tokens: int


class MagnitudesJson(TypedDict):
    """A histogram of |x| (``eaglequant.validate.scale_effects.Magnitudes``): bins from
    ``first`` on, ``bins_per_binade`` equal bins per power of two from 2^``first_binade``;
    each bin's count, and its count, sum and squares weighted by 1 / the row's power."""

    bins_per_binade: int
    first_binade: int
    first: int
    count: list[float]
    weights: list[float]
    sum: list[float]
    sum_squares: list[float]
    row_amax: list[float]  # rows (tokens) by the bin of their largest |x|
    rows: int
    zeros: int
    nonfinite: int
    amax: float


class LinearRange(TypedDict):
    """One draft linear as vLLM ran it (``eaglequant.validate.draft_ranges``): calls, largest
    |input|, and largest |output| of each fused part; the histograms of |input| and (K and V
    projections) of each part's |output| that check 6 judges scales on."""

    calls: int
    input_amax: float
    output_amax: list[float]
    input_magnitudes: NotRequired[MagnitudesJson]
    output_magnitudes: NotRequired[list[MagnitudesJson]]


class SpecMetrics(TypedDict, total=False):
    """vLLM's counters (``LLM.get_metrics()``): spec decode (none without speculation) and
    the prefix cache's prompt tokens looked up and served from cached blocks."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: list[int]
    prefix_cache_queries: int
    prefix_cache_hits: int


class SampledRun(TypedDict):
    """One run sampled at ``temperature`` (prompt ``i`` seeded ``seed * prompts + i``) after
    the greedy one: each prompt's verify steps and vLLM's counters over this run alone."""

    temperature: float
    seed: int
    per_request: list[RequestCounts | None]
    metrics: SpecMetrics
    generate_s: float


class EngineRecord(TypedDict):
    """The exact engine: ``vllm.LLM`` arguments, vLLM environment and version, serve line."""

    llm: dict[str, Any]
    env: dict[str, str]
    vllm: str
    serve_line: str


# Per prompt, per generated position: ``[[token, logprob], …]`` by rank (None: not asked).
TopLogprobs = list[list[list[float]]] | None


class Generated(TypedDict):
    """One engine run's outputs and what the engine reports, before its timings."""

    schema_version: int
    token_ids: list[list[int]]
    top_logprobs: list[TopLogprobs]
    texts: list[str]
    metrics: SpecMetrics
    per_request: list[RequestCounts | None] | None  # None: no speculation
    draft_layers: list[DraftLayer]
    draft_attention: NotRequired[list[DraftAttention]]
    platform: str
    kernels: list[str]
    plugin_active: bool
    engine_config: EngineRecord
    # Per prompt, per generated position: the target's ranked logprobs when the prompt and the
    # run's own output are scored in one prefill of the same engine (``prompt_logprobs``).
    teacher_forced: NotRequired[list[TopLogprobs]]
    teacher_forced_scores: NotRequired[str]  # vLLM's logprobs_mode for them ("raw_logits")
    prompt_token_ids: NotRequired[list[list[int]]]  # each prompt as the engine tokenized it
    # the control run's tokens scored again by this engine's target, after this run
    control_rescored: NotRequired[list[TopLogprobs]]
    score_s: NotRequired[float]  # seconds of that scoring
    # Per draft linear as vLLM built it, seen while generating (check 6's ranges).
    draft_ranges: NotRequired[dict[str, LinearRange]]
    sampled: NotRequired[list[SampledRun]]  # asked for: checks 2 and 5 judge these instead


class EngineResult(Generated):
    """One engine run as the child writes it; ``swapped``: a draft swapped into a running engine."""

    load_s: float
    generate_s: float
    swapped: NotRequired[bool]
    second_turns: NotRequired[AnsweredJson]  # the engine that answered the first turns


class SharedRuns(TypedDict):
    """Every draft's run in one engine (``single_engine``), and why a swap was refused."""

    schema_version: int
    runs: list[EngineResult]
    refused: str | None


class EngineRun(TypedDict):
    """One engine child as the parent saw it end, with its result when it finished."""

    ok: bool
    returncode: int | None
    timed_out: bool
    wall_s: float
    log: str
    result: NotRequired[EngineResult]
    shared_engine: NotRequired[bool]
    refused: NotRequired[str | None]


def read_engine_result(path: Path) -> EngineResult:
    """An engine child's result; InputError when it is unreadable or of another schema version."""
    data = read_json_object(path, "engine result")
    check_engine_schema(path, data)
    return cast(EngineResult, data)


def read_shared_runs(path: Path) -> SharedRuns:
    """A shared engine child's runs; InputError as :func:`read_engine_result`."""
    data = read_json_object(path, "engine result")
    check_engine_schema(path, data)
    for run in data.get("runs", []):
        check_engine_schema(path, run)
    return cast(SharedRuns, data)


def check_engine_schema(path: Path, data: dict[str, Any]) -> None:
    """InputError, one line naming ``path``, unless ``data`` is at :data:`ENGINE_RESULT_SCHEMA`."""
    found = data.get("schema_version")
    fix = "reinstall eaglequant so that its engine child is this version"
    if found is None:
        raise InputError(
            f"{path}: an engine result without schema_version (an older eaglequant's engine "
            f"child); {fix}"
        )
    if found != ENGINE_RESULT_SCHEMA:
        raise InputError(
            f"{path}: engine result schema_version {found!r}, this eaglequant reads "
            f"{ENGINE_RESULT_SCHEMA}; {fix}"
        )
