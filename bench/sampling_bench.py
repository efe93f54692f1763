"""An FP8 draft's acceptance against its BF16 draft, greedy and sampled, side by side from one
run: both drafts swapped into one vLLM engine (``validate``'s), each run greedy and then once
per seed at the temperature, checks 2 and 5 judged on the greedy counts and on the sampled
ones (each prompt's counts summed over its seeds, as ``validate --temperature`` judges them).

    python bench/sampling_bench.py TARGET FP8_DRAFT BF16_DRAFT [--prompts mt-bench] \
        [--temperature 0.7] [--seeds 0,1] [--k 3] [--max-tokens 128] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from eaglequant.prompts.source import load_prompts, parse_source
from eaglequant.recipe import load_recipe
from eaglequant.results.spec_counts import SpecDecodeCounts
from eaglequant.validate.acceptance_checks import (
    AcceptanceThresholds,
    acceptance_checks,
    judged_counts,
    prompt_counts,
)
from eaglequant.validate.request import ValidateRequest, engine_prompts
from eaglequant.validate.single_engine import run_single
from eaglequant.validate.stats import PromptCounts, pooled_counts
from eaglequant.validate.validation import run_engine


def interval(numbers: dict[str, float]) -> str:
    """A check's interval as the reports print it: ``0.992 [0.983, 1.002]``."""
    return f"{numbers['point']:.3f} [{numbers['low']:.3f}, {numbers['high']:.3f}]"


def judged(
    fp8: list[PromptCounts], bf16: list[PromptCounts], thresholds: AcceptanceThresholds
) -> dict[str, Any]:
    """Checks 2 and 5 on these counts: each draft's acceptance, the ratios with intervals."""
    two, five = acceptance_checks(fp8, bf16, thresholds)

    def acceptance(counts: list[PromptCounts]) -> dict[str, Any]:
        record = pooled_counts(counts).acceptance()
        return {
            "mean_length": round(record.mean_length, 4),
            "per_position": [round(p, 4) for p in record.per_position],
        }

    return {
        "fp8": acceptance(fp8),
        "bf16": acceptance(bf16),
        "ratio": interval(two.numbers["interval"]),
        "check_2": two.verdict,
        "position_ratios": [interval(i) for i in five.numbers["intervals"]],
        "check_5": five.verdict,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("baseline", type=Path)
    parser.add_argument("--prompts", default="mt-bench")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, help="the first N prompts")
    parser.add_argument(
        "--hidden-states", type=Path, help="a capture of the target: no draft ranges recorded"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    prompt_set = load_prompts(parse_source(args.prompts))
    texts = prompt_set.texts[: args.limit] if args.limit else prompt_set.texts
    seeds = tuple(int(s) for s in args.seeds.split(","))
    spec = load_recipe().validation
    request = ValidateRequest(
        target=args.target,
        draft=args.draft,
        baseline=args.baseline,
        prompts=texts,
        k=args.k,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        sampling_seeds=seeds,
        hidden_states=args.hidden_states,
        reference_engine=True,  # no check 1 here: no teacher-forced scoring
    )
    rendered = engine_prompts(request)
    began = time.perf_counter()
    roles = [("bf16", args.baseline), ("fp8", args.draft)]
    runs = run_single(
        request,
        rendered,
        roles,
        lambda draft: run_engine(request, draft, rendered),
        lambda m: print(f"[bench] {m}", flush=True),
    )
    wall = time.perf_counter() - began
    failed = [role for role, e in runs.engines.items() if not e["ok"]]
    if failed:
        raise SystemExit(f"engines failed: {failed}: {runs.engines[failed[0]]['log'][-2000:]}")
    results = {role: runs.engines[role]["result"] for role, _ in roles}
    greedy = AcceptanceThresholds(
        min_acceptance_ratio=spec.min_acceptance_ratio,
        min_position_ratio=spec.min_position_ratio,
    )
    sampled = AcceptanceThresholds(
        min_acceptance_ratio=spec.min_acceptance_ratio,
        min_position_ratio=spec.min_position_ratio,
        temperature=args.temperature,
        sampling_seeds=seeds,
    )
    by_seed = {
        role: [
            SpecDecodeCounts.from_vllm(run["metrics"]).acceptance().mean_length
            for run in result.get("sampled", [])
        ]
        for role, result in results.items()
    }
    report = {
        "workload": {
            "prompts": prompt_set.source,
            "prompt_count": len(texts),
            "chat_template": rendered.chat_template,
            "k": args.k,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "seeds": list(seeds),
            "concurrency": "all prompts at once (offline vllm.LLM)",
        },
        "greedy": judged(prompt_counts(results["fp8"]), prompt_counts(results["bf16"]), greedy),
        "sampled": judged(judged_counts(results["fp8"]), judged_counts(results["bf16"]), sampled),
        "sampled_mean_length_by_seed": by_seed,
        "engine_mode": runs.mode,
        "wall_s": round(wall, 1),
        "machine": platform.processor() or platform.machine(),
    }
    text = json.dumps(report, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
