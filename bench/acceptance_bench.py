"""A BF16 EAGLE-3 draft's acceptance in vLLM, by prompt set, category and position.

One speculative engine (greedy, chat template, k drafts) answers every prompt
of each set; vLLM's own spec-decode counters are read before and after each
category, so every row is vLLM's counting. Mean acceptance length is
1 + accepted / drafts (the tokens each verify step emits).

    python bench/acceptance_bench.py TARGET DRAFT [--sets mt-bench,humaneval] [--k 3] \
        [--max-tokens 256] [--out bench/results-acceptance-smollm2.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "per_position",
}


def counters(llm: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for metric in llm.get_metrics():
        key = COUNTERS.get(metric.name)
        if key is not None:
            found[key] = list(metric.values) if hasattr(metric, "values") else metric.value
    return found


def row(
    after: dict[str, Any], before: dict[str, Any], tokens: int, seconds: float
) -> dict[str, Any]:
    drafts = after["drafts"] - before.get("drafts", 0)
    accepted = after["accepted"] - before.get("accepted", 0)
    earlier = before.get("per_position") or [0] * len(after["per_position"])
    per_position = [a - b for a, b in zip(after["per_position"], earlier, strict=True)]
    return {
        "drafts": drafts,
        "accepted": accepted,
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "acceptance_by_position": [round(p / drafts, 4) for p in per_position] if drafts else [],
        "generated_tokens": tokens,
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--sets", default="mt-bench,humaneval")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    from eaglequant.prompts.source import load_prompts, parse_source
    from eaglequant.speculative import speculative_config

    llm = LLM(
        str(args.target),
        dtype="bfloat16",
        max_model_len=4096,
        seed=0,
        speculative_config=speculative_config(str(args.draft), args.k),
        disable_log_stats=False,
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    results: dict[str, Any] = {}
    for name in args.sets.split(","):
        prompts = load_prompts(parse_source(name))
        by_category: dict[str, list[str]] = defaultdict(list)
        for prompt in prompts.prompts:
            by_category[prompt.category or name].append(prompt.text)
        start, first = counters(llm), time.monotonic()
        categories = {}
        for category, texts in sorted(by_category.items()):
            before, started = counters(llm), time.monotonic()
            outs = llm.chat([[{"role": "user", "content": t}] for t in texts], params)
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            categories[category] = row(counters(llm), before, tokens, time.monotonic() - started)
            categories[category]["prompts"] = len(texts)
        total = sum(c["generated_tokens"] for c in categories.values())
        results[name] = row(counters(llm), start, total, time.monotonic() - first)
        results[name] |= {"prompts": len(prompts.prompts), "sha256": prompts.sha256}
        results[name]["categories"] = categories
        print(name, json.dumps(results[name]["mean_acceptance_length"]), flush=True)
    report = {
        "k": args.k,
        "max_tokens": args.max_tokens,
        "greedy": True,
        "chat_template": True,
        "machine": platform.processor() or platform.machine(),
        "sets": results,
    }
    text = json.dumps(report, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
