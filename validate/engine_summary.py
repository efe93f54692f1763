"""What a validation report keeps of each engine run: its outputs and their digest, vLLM's
spec-decode counters and the acceptance they give, its timings and configuration."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from eaglequant.engine.process import log_tail
from eaglequant.engine.result import EngineRun


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
        summary["acceptance"] = acceptance(result["metrics"])
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


def acceptance(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Mean acceptance length (1 + accepted / drafts, as vLLM's example) and per position."""
    drafts = metrics.get("num_drafts", 0)
    accepted = metrics.get("num_accepted_tokens", 0)
    per_pos = metrics.get("accepted_per_pos", [])
    return {
        "mean_length": 1 + accepted / drafts if drafts else None,
        "per_position": [a / drafts for a in per_pos] if drafts else [],
        "drafts": drafts,
        "accepted": accepted,
    }
