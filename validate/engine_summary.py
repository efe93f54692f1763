"""What a validation report keeps of each engine run: its outputs and their digest, vLLM's
spec-decode counters and the acceptance they give, its timings and configuration."""

from __future__ import annotations

import json
from typing import Any

from eaglequant.engine.process import log_tail
from eaglequant.engine.result import EngineRun
from eaglequant.spec_counts import SpecDecodeCounts


def engine_summary(engine: EngineRun) -> dict[str, Any]:
    """What the report keeps of one engine run (its outputs, counters, timings; a failed one's
    log tail)."""
    summary: dict[str, Any] = {k: engine[k] for k in ("ok", "returncode", "timed_out", "wall_s")}
    result = engine.get("result")
    if result is not None:
        summary |= {
            k: result[k]
            for k in ("load_s", "generate_s", "swapped", "metrics", "kernels", "engine_config")
            if k in result
        }
        summary["acceptance"] = acceptance(SpecDecodeCounts.from_vllm(result["metrics"]))
        if result["per_request"] is not None:
            summary["per_prompt"] = result["per_request"]
        summary["outputs_sha256"] = outputs_digest(result["token_ids"])
        summary["token_ids"] = result["token_ids"]
    if not engine["ok"]:
        summary["log_tail"] = log_tail(engine["log"])
    return summary


def outputs_digest(token_ids: list[list[int]]) -> str:
    """One hash of every generated token id: equal hashes, equal greedy outputs (any machine)."""
    import hashlib

    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()


def acceptance(counts: SpecDecodeCounts) -> dict[str, Any]:
    """The report's acceptance: mean acceptance length (1 + accepted / drafts, as vLLM's
    example) and per position, with the counts they come from."""
    return {
        "mean_length": counts.mean_acceptance_length,
        "per_position": counts.per_position_rates,
        "drafts": counts.drafts,
        "accepted": counts.accepted_tokens,
    }
