"""Speculative-decoding acceptance from the server's own Prometheus counters.

vLLM counts, per engine, ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos{position="i"}``
(``vllm/v1/spec_decode/metrics.py``). A snapshot before and after one measurement
gives its deltas, summed over engines (data parallel), and from them the mean
acceptance length (1 + accepted / drafts) and the acceptance rate by draft position
(accepted at i / drafts). ``bench_problem`` holds ``vllm bench serve``'s own
result file to the same counts: they read the same counters, so anything beyond
float rounding means the two measured different traffic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from eaglequant.results.spec_counts import SpecDecodeCounts

PREFIX = "vllm:spec_decode_"
POSITION_LABEL = 'position="'


def parse_counters(text: str) -> SpecDecodeCounts | None:
    """The spec-decode counters in a Prometheus text page; None when it has none."""
    totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    per_position: dict[int, int] = {}
    found = False
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{", 1)[0].removeprefix(PREFIX)
        if not metric.endswith("_total"):
            continue  # ``_created`` timestamps
        found = True
        metric = metric.removesuffix("_total")
        count = int(float(value))
        if metric == "num_accepted_tokens_per_pos":
            start = name.index(POSITION_LABEL) + len(POSITION_LABEL)
            position = int(name[start : name.index('"', start)])
            per_position[position] = per_position.get(position, 0) + count
        elif metric in totals:
            totals[metric] += count
    if not found:
        return None
    positions = max(per_position, default=-1) + 1
    return SpecDecodeCounts(
        drafts=totals["num_drafts"],
        draft_tokens=totals["num_draft_tokens"],
        accepted_tokens=totals["num_accepted_tokens"],
        accepted_per_position=tuple(per_position.get(p, 0) for p in range(positions)),
    )


def bench_problem(delta: SpecDecodeCounts | None, bench: Mapping[str, Any]) -> str | None:
    """How a bench result file's acceptance differs from the counters' delta (None: it agrees)."""
    if delta is None or not delta.drafts:
        if bench.get("spec_decode_num_drafts"):
            return f"the bench counted {bench['spec_decode_num_drafts']} drafts, /metrics none"
        return None
    if "spec_decode_num_drafts" not in bench:
        return f"/metrics counted {delta.drafts} drafts, the bench recorded no acceptance"
    pairs = {
        "drafts": (delta.drafts, bench["spec_decode_num_drafts"]),
        "draft tokens": (delta.draft_tokens, bench["spec_decode_draft_tokens"]),
        "accepted tokens": (delta.accepted_tokens, bench["spec_decode_accepted_tokens"]),
    }
    for what, (ours, theirs) in pairs.items():
        if ours != theirs:
            return f"{what}: /metrics {ours}, bench {theirs}"
    rates = list(bench.get("spec_decode_per_position_acceptance_rates") or [])
    if len(rates) != len(delta.per_position_rates) or not all(
        math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
        for a, b in zip(delta.per_position_rates, rates, strict=False)
    ):
        return f"acceptance by position: /metrics {delta.per_position_rates}, bench {rates}"
    length = bench.get("spec_decode_acceptance_length")
    if length is None or not math.isclose(delta.mean_acceptance_length or 0, length, rel_tol=1e-9):
        return f"acceptance length: /metrics {delta.mean_acceptance_length}, bench {length}"
    return None
