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
from typing import Any

DRAFT_TENSOR_PARALLEL_SIZE = 1


def speculative_config(draft: str, k: int) -> dict[str, Any]:
    """``--speculative-config`` for an EAGLE-3 draft proposing ``k`` tokens."""
    return {
        "model": draft,
        "method": "eagle3",
        "num_speculative_tokens": k,
        "draft_tensor_parallel_size": DRAFT_TENSOR_PARALLEL_SIZE,
    }


def schedule_config(draft: str, schedule: Sequence[Sequence[int]]) -> dict[str, Any]:
    """``--speculative-config`` proposing k tokens by batch size (``[first, last, k]`` ranges).

    ``num_speculative_tokens`` is the largest k: vLLM caps every range's k at it.
    """
    largest = max(k for _, _, k in schedule)
    return speculative_config(draft, largest) | {
        "num_speculative_tokens_per_batch_size": [list(r) for r in schedule]
    }
