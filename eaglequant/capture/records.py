"""What a capture records, one type each: where its sequences came from, the engine run that
filled its file (transformers, or vLLM's replicas with each replica's spec and result), and
``capture.json`` as :func:`eaglequant.capture.run.capture_into` writes it. Torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:  # Python 3.11's; annotations stay strings at run time (3.10 too)
    from typing import Required

    from eaglequant.results.engine_result import EngineRecord


class DataProvenance(TypedDict):
    """The calibration data: the source as given, its sha256, the texts used and their hashes."""

    source: str
    sha256: str
    texts: int
    text_hashes: list[str]


class CaptureSource(TypedDict, total=False):
    """Where a capture's sequences came from (``capture.json`` holds these keys as given)."""

    data: DataProvenance
    draft_checked: bool  # the layers were checked against a draft's


class TransformersRun(TypedDict):
    """The transformers engine's record: its version, dtype, timings and peak memory."""

    name: Literal["transformers"]
    transformers: str
    dtype: str
    load_s: float
    run_s: float
    peak_rss_mib: float | None


class ReplicaSpec(TypedDict):
    """One vLLM capture replica's ``spec.json``: the engine, the layers, its share of rows."""

    llm: dict[str, Any]  # vllm.LLM's arguments (the user's engine arguments among them)
    aux_layer_ids: list[int]
    file: str
    rows: list[int]  # [first, end)
    scratch: str
    chunk: int


class ReplicaResult(TypedDict):
    """What one vLLM capture replica reports: its engine, rows, tokens, timings, memory."""

    platform: str
    kernels: list[str]
    engine_config: EngineRecord
    rows: list[int]
    tokens: int
    load_s: float
    run_s: float
    peak_rss_mib: float | None


class VllmRun(TypedDict):
    """The vLLM engine's record: version, platform, parallelism, arguments, every replica's
    result, and the slowest replica's timings."""

    name: Literal["vllm"]
    vllm: str
    platform: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    engine_args: dict[str, Any]  # the user's vllm.LLM arguments, as given
    replicas: list[ReplicaResult]
    load_s: float
    run_s: float


class CaptureInfo(TypedDict, total=False):
    """``capture.json`` (format name first): every key where the engines filled the folder;
    one :func:`eaglequant.capture.store.save_capture` wrote holds the format, the tokens and
    what it was given."""

    format: Required[str]
    target: str
    data: DataProvenance
    draft_checked: bool
    aux_layer_ids: list[int]
    target_hidden_size: int | None
    vocab_size: int | None
    sequences: int
    seq_len: int
    tokens: Required[int]
    embeddings: bool
    engine: TransformersRun | VllmRun
    tokens_per_s: float | None
