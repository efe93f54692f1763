"""How vLLM serves an EAGLE-3 draft: the one speculative-config dict every path uses.

validate's engines, tune's servers, the serve line in reports and the model
card's usage line all build it here (the draft at tensor parallel size 1, as
the reference serve line runs it beside a TP=4 target).
"""

from __future__ import annotations

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
