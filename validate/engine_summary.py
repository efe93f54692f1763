"""What a validation report keeps of each engine run: its outputs and their digest, vLLM's
spec-decode counters and the acceptance they give, its timings and configuration."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from eaglequant.engine.process import log_tail
from eaglequant.results.engine_result import EngineRun
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.results.validation_report import EngineSummary


def engine_summary(engine: EngineRun) -> EngineSummary:
    """What the report keeps of one engine run (its outputs, counters, timings; a failed one's
    log tail)."""
    result = engine.get("result")
    tail = None if engine["ok"] else log_tail(engine["log"])
    ended = EngineSummary(
        ok=engine["ok"],
        returncode=engine["returncode"],
        timed_out=engine["timed_out"],
        wall_s=engine["wall_s"],
        log_tail=tail,
    )
    if result is None:
        return ended
    return replace(
        ended,
        load_s=result["load_s"],
        generate_s=result["generate_s"],
        swapped=result.get("swapped"),
        metrics=result["metrics"],
        kernels=result["kernels"],
        engine_config=result["engine_config"],
        acceptance=SpecDecodeCounts.from_vllm(result["metrics"]).acceptance(),
        per_prompt=result["per_request"],
        outputs_sha256=outputs_digest(result["token_ids"]),
        token_ids=result["token_ids"],
    )


def outputs_digest(token_ids: list[list[int]]) -> str:
    """One hash of every generated token id: equal hashes, equal greedy outputs (any machine)."""
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()
