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
from dataclasses import dataclass, field
from typing import Any

PREFIX = "vllm:spec_decode_"
POSITION_LABEL = 'position="'


@dataclass(frozen=True)
class SpecCounters:
    """The spec-decode counters at one moment (or the difference of two moments)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: dict[int, int] = field(default_factory=dict)

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        positions = sorted(set(self.accepted_per_position) | set(before.accepted_per_position))
        return SpecCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_tokens=self.accepted_tokens - before.accepted_tokens,
            accepted_per_position={
                p: self.accepted_per_position.get(p, 0) - before.accepted_per_position.get(p, 0)
                for p in positions
            },
        )

    def __add__(self, other: SpecCounters) -> SpecCounters:
        positions = sorted(set(self.accepted_per_position) | set(other.accepted_per_position))
        return SpecCounters(
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted_tokens=self.accepted_tokens + other.accepted_tokens,
            accepted_per_position={
                p: self.accepted_per_position.get(p, 0) + other.accepted_per_position.get(p, 0)
                for p in positions
            },
        )

    @property
    def acceptance_length(self) -> float | None:
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def per_position(self) -> list[float]:
        if not self.drafts:
            return []
        return [
            self.accepted_per_position[p] / self.drafts for p in sorted(self.accepted_per_position)
        ]


def parse_counters(text: str) -> SpecCounters | None:
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
    return SpecCounters(
        drafts=totals["num_drafts"],
        draft_tokens=totals["num_draft_tokens"],
        accepted_tokens=totals["num_accepted_tokens"],
        accepted_per_position=per_position,
    )


def bench_problem(delta: SpecCounters | None, bench: Mapping[str, Any]) -> str | None:
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
    if len(rates) != len(delta.per_position) or not all(
        math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
        for a, b in zip(delta.per_position, rates, strict=False)
    ):
        return f"acceptance by position: /metrics {delta.per_position}, bench {rates}"
    length = bench.get("spec_decode_acceptance_length")
    if length is None or not math.isclose(delta.acceptance_length or 0, length, rel_tol=1e-9):
        return f"acceptance length: /metrics {delta.acceptance_length}, bench {length}"
    return None
