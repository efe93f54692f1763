"""A BF16 EAGLE-3 draft's acceptance in vLLM, by prompt set, category and position.

One speculative engine (greedy, chat template, k drafts) answers every prompt
of each set, a category at a time; vLLM's own spec-decode counters are read
before and after each, so every row is vLLM's counting. Mean acceptance
length is 1 + accepted / drafts (the tokens each verify step emits). Each
set's 95% interval is a bootstrap over its prompts, from vLLM's per-request
histograms of accepted drafts per verify step.

Run as a child: ``python -m eaglequant.examples.acceptance SPEC OUT`` (SPEC: JSON
with target, draft, sets, k, max_tokens).
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from eaglequant.validate.stats import PromptCounts, bootstrap_length

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "per_position",
}


def counters(llm: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"drafts": 0, "accepted": 0, "per_position": []}
    for metric in llm.get_metrics():
        key = COUNTERS.get(metric.name)
        if key is not None:
            found[key] = list(metric.values) if hasattr(metric, "values") else metric.value
    return found


def row(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted"] - before["accepted"]
    earlier = before["per_position"] or [0] * len(after["per_position"])
    per_position = [a - b for a, b in zip(after["per_position"], earlier, strict=True)]
    return {
        "drafts": drafts,
        "accepted": accepted,
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "acceptance_by_position": [round(p / drafts, 4) for p in per_position] if drafts else [],
    }


def _prompt_counts(completion: Any) -> PromptCounts:
    metrics = completion.spec_decode_metrics
    return PromptCounts(tuple(int(c) for c in metrics.histogram), int(metrics.num_draft_tokens))


def measure(
    *, target: Path, draft: Path, sets: list[str], k: int, max_tokens: int, limit: int | None
) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    from eaglequant.prompts.source import load_prompts, parse_source
    from eaglequant.speculative import speculative_config

    llm = LLM(
        str(target),
        dtype="bfloat16",
        max_model_len=4096,
        seed=0,
        speculative_config=speculative_config(str(draft), k),
        disable_log_stats=False,
        per_request_spec_decode_metrics="summary",
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    results: dict[str, Any] = {}
    for name in sets:
        prompts = load_prompts(parse_source(name))
        by_category: dict[str, list[str]] = defaultdict(list)
        for prompt in prompts.prompts[:limit]:
            by_category[prompt.category or name].append(prompt.text)
        start, first = counters(llm), time.monotonic()
        categories, tokens, per_prompt = {}, 0, []
        for category, texts in sorted(by_category.items()):
            before = counters(llm)
            outs = llm.chat([[{"role": "user", "content": t}] for t in texts], params)
            tokens += sum(len(o.outputs[0].token_ids) for o in outs)
            per_prompt += [_prompt_counts(o.outputs[0]) for o in outs]
            categories[category] = row(counters(llm), before) | {"prompts": len(texts)}
        interval = bootstrap_length(per_prompt)
        results[name] = row(counters(llm), start) | {
            "interval_95": [round(interval.low, 4), round(interval.high, 4)],
            "prompts": sum(len(t) for t in by_category.values()),
            "sha256": prompts.sha256,
            "generated_tokens": tokens,
            "seconds": round(time.monotonic() - first, 1),
            "categories": categories,
        }
    return {"k": k, "max_tokens": max_tokens, "greedy": True, "chat_template": True} | {
        "sets": results
    }


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = measure(
        target=Path(spec["target"]),
        draft=Path(spec["draft"]),
        sets=spec["sets"],
        k=spec["k"],
        max_tokens=spec["max_tokens"],
        limit=spec.get("limit"),
    )
    Path(sys.argv[2]).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
