"""How vLLM serves an EAGLE-3 draft: the one speculative-config dict every path uses.

validate's engines, tune's servers, the serve line in reports and the model
card's usage line all build it here (the draft at tensor parallel size 1, as
the reference serve line runs it beside a TP=4 target). A per-batch-size
schedule (vLLM's dynamic speculative decoding) is the same dict with
``num_speculative_tokens_per_batch_size``: inclusive batch-size ranges
``[first, last, k]``, k 0 meaning no speculation for that range.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from eaglequant.io.model_config import ModelConfig

DRAFT_TENSOR_PARALLEL_SIZE = 1
# vLLM's CacheDType values a draft's KV cache can take (its speculative config's
# ``kv_cache_dtype``; unset: the draft inherits the target's ``--kv-cache-dtype``)
DRAFT_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
# The KV cache a draft with calibrated K/V scales (Quark's ``kv_cache_group``) runs with:
# vLLM uses the scales only when the cache is FP8, and Quark's are FP8 E4M3 per tensor.
SCALED_KV_CACHE_DTYPE = "fp8_e4m3"


class SpeculativeDict(TypedDict, total=False):
    """vLLM's ``--speculative-config`` as eaglequant writes it (``SpeculativeDict``'s fields
    in ``vllm/config/speculative.py``)."""

    model: str
    method: str
    num_speculative_tokens: int
    draft_tensor_parallel_size: int
    kv_cache_dtype: str
    attention_backend: str
    num_speculative_tokens_per_batch_size: list[list[int]]


def kv_source(draft: Path) -> str:
    """What asked for a draft's KV cache dtype, for an error line."""
    return f"--draft-kv-cache-dtype (or {draft}'s calibrated K/V scales)"


def draft_kv_cache_dtype(asked: str | None, draft_config: ModelConfig) -> str | None:
    """The draft KV cache dtype to run: ``asked``, else FP8 E4M3 for a draft whose checkpoint
    carries calibrated K/V scales, else None (the target's)."""
    if asked is not None:
        return asked
    export = (draft_config.get("quantization_config") or {}).get("export") or {}
    return SCALED_KV_CACHE_DTYPE if export.get("kv_cache_group") else None


def speculative_config(
    draft: str, k: int, kv_cache_dtype: str | None = None, *, attention_backend: str | None = None
) -> SpeculativeDict:
    """``--speculative-config`` for an EAGLE-3 draft proposing ``k`` tokens (its KV cache in
    ``kv_cache_dtype``, else the target's; its attention in vLLM's backend
    ``attention_backend``, else the one vLLM picks for the draft, never the target's)."""
    config: SpeculativeDict = {
        "model": draft,
        "method": "eagle3",
        "num_speculative_tokens": k,
        "draft_tensor_parallel_size": DRAFT_TENSOR_PARALLEL_SIZE,
    }
    if kv_cache_dtype is not None:
        config["kv_cache_dtype"] = kv_cache_dtype
    if attention_backend is not None:
        config["attention_backend"] = attention_backend
    return config


def schedule_config(
    draft: str, schedule: Sequence[Sequence[int]], kv_cache_dtype: str | None = None
) -> SpeculativeDict:
    """``--speculative-config`` proposing k tokens by batch size (``[first, last, k]`` ranges).

    ``num_speculative_tokens`` is the largest k: vLLM caps every range's k at it.
    """
    largest = max(k for _, _, k in schedule)
    config = speculative_config(draft, largest, kv_cache_dtype)
    config["num_speculative_tokens_per_batch_size"] = [list(r) for r in schedule]
    return config
