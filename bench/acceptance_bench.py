"""A BF16 EAGLE-3 draft's acceptance in vLLM, by prompt set, category and position.

    python bench/acceptance_bench.py TARGET DRAFT [--sets mt-bench,humaneval] [--k 3] \
        [--max-tokens 256] [--out bench/results-acceptance-smollm2.json]

The measurement is :mod:`eaglequant_examples.acceptance` (vLLM's own counters).
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from eaglequant.results.workload import AcceptanceWorkload
from eaglequant_examples.acceptance import measure


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--sets", default="mt-bench,humaneval")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, help="the first N prompts of each set")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = measure(
        target=args.target,
        draft=args.draft,
        sets=args.sets.split(","),
        k=args.k,
        max_tokens=args.max_tokens,
        limit=args.limit,
    ) | {"machine": platform.processor() or platform.machine()}
    text = json.dumps(report, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    for name, result in report["sets"].items():
        low, high = result["interval_95"]
        label = AcceptanceWorkload.from_json(result["workload"]).describe()
        print(
            f"{name}: mean acceptance length {result['mean_acceptance_length']:.3f} "
            f"[{low:.3f}, {high:.3f}]; workload: {label}"
        )


if __name__ == "__main__":
    main()
