"""A BF16 EAGLE-3 draft's acceptance in vLLM, by prompt set, category and position.

One speculative engine (greedy, chat template, k drafts) answers every prompt
of each set, a category at a time. Every row pools vLLM's per-request
histograms of accepted drafts per verify step (checked, in sum, against its
global spec-decode counters). Mean acceptance length is 1 + accepted / verify
steps (the tokens each step emits). Each set's 95% interval is a bootstrap over
its prompts.

Run as a child: ``python -m eaglequant_examples.acceptance SPEC OUT`` (SPEC: JSON
with target, draft, sets, k, max_tokens).
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from eaglequant.results.workload import AcceptanceWorkload
from eaglequant.validate.engine_run import request_counts, spec_metrics
from eaglequant.validate.stats import (
    PromptCounts,
    bootstrap_length,
    counts_mismatch,
    pooled_quantities,
)
from eaglequant_examples.records import (
    AcceptanceMeasure,
    AcceptanceRow,
    CategoryAcceptance,
    SetAcceptance,
)


def row(prompts: list[PromptCounts], k: int) -> AcceptanceRow:
    """Pooled over ``prompts``: verify steps, accepted drafts, mean length, per-position rates."""
    length, *rates = pooled_quantities(prompts, k)
    return {
        "drafts": sum(p.drafts for p in prompts),
        "accepted": sum(p.accepted for p in prompts),
        "mean_acceptance_length": round(length, 4),
        "acceptance_by_position": [round(r, 4) for r in rates],
    }


def _prompt_counts(completion: Any) -> PromptCounts:
    counts = request_counts(completion)
    if counts is None:
        raise RuntimeError("vLLM returned no per-request spec-decode counts for a prompt")
    return PromptCounts.from_json(counts)


def measure(
    *, target: Path, draft: Path, sets: list[str], k: int, max_tokens: int, limit: int | None
) -> AcceptanceMeasure:
    from vllm import LLM, SamplingParams

    from eaglequant.prompts.source import load_prompts, parse_source
    from eaglequant.rules.speculative import speculative_config

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
    results: dict[str, SetAcceptance] = {}
    every: list[PromptCounts] = []
    for name in sets:
        prompts = load_prompts(parse_source(name))
        by_category: dict[str, list[str]] = defaultdict(list)
        for prompt in prompts.prompts[:limit]:
            by_category[prompt.category or name].append(prompt.text)
        first = time.monotonic()
        categories: dict[str, CategoryAcceptance] = {}
        tokens, per_prompt = 0, []
        for category, texts in sorted(by_category.items()):
            outs = llm.chat([[{"role": "user", "content": t}] for t in texts], params)
            tokens += sum(len(o.outputs[0].token_ids) for o in outs)
            counts = [_prompt_counts(o.outputs[0]) for o in outs]
            categories[category] = {**row(counts, k), "prompts": len(texts)}
            per_prompt += counts
        every += per_prompt
        interval = bootstrap_length(per_prompt)
        workload = AcceptanceWorkload(
            prompt_set=name,
            prompts=len(per_prompt),
            chat_template=True,
            k=k,
            max_tokens=max_tokens,
            ignore_eos=False,  # answers stop at EOS
            concurrency=max(len(texts) for texts in by_category.values()),  # a category a time
        )
        results[name] = {
            **row(per_prompt, k),
            "interval_95": [round(interval.low, 4), round(interval.high, 4)],
            "prompts": len(per_prompt),
            "sha256": prompts.sha256,
            "generated_tokens": tokens,
            "seconds": round(time.monotonic() - first, 1),
            "categories": categories,
            "workload": workload.to_json(),
        }
    mismatch = counts_mismatch(every, spec_metrics(llm))
    if mismatch:  # the per-prompt counts must be vLLM's own counting, all of it
        raise RuntimeError(f"per-request counts disagree with vLLM's counters: {mismatch}")
    return {
        "k": k,
        "max_tokens": max_tokens,
        "greedy": True,
        "chat_template": True,
        "sets": results,
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
