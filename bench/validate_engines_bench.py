"""Validate's engines: one engine swapping the drafts against one engine per draft, side by side.

For the toy pair and for the deeper toy target (56 zero layers more, so loading
and running the target weigh as they do beside a real draft), validate's three
engine runs (target alone, BF16 draft, FP8 draft) are made twice on the same
prompts: by validate's default runner (the target alone, then both drafts in one
engine that swaps them) and by ``--engine-per-draft``'s (an engine each). Recorded
per mode: target loads, wall time, seconds loading (engine start, or the swap)
and generating, and whether both modes gave the same tokens and spec-decode
counters. Check 6's capture (one more target load in either mode unless
``--hidden-states`` is given) is not part of this.

    python bench/validate_engines_bench.py [--prompts 8] [--max-tokens 32] \
        [--out bench/results-validate-engines.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOY = HERE.parent / "examples" / "toy"
ADDED_LAYERS = 56
ROLES = ("target", "bf16", "fp8")


def export_fp8(out: Path) -> Path:
    eaglequant = Path(sys.executable).parent / "eaglequant"
    args = [str(eaglequant), "export", str(TOY / "draft"), str(out)]
    args += ["--calib-target", str(TOY / "target"), "--calib-data", str(TOY / "calibration.jsonl")]
    subprocess.run(args, check=True, capture_output=True)
    return out


def measure(target: Path, fp8: Path, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    from eaglequant.validate.single_engine import run_per_draft, run_single
    from eaglequant.validate.validation import ValidateRequest, run_engine

    request = ValidateRequest(
        target=target,
        draft=fp8,
        baseline=TOY / "draft",
        prompts=prompts,
        max_tokens=max_tokens,
        engine_timeout_s=900,
    )
    roles = [("target", None), ("bf16", request.baseline), ("fp8", request.draft)]
    runners = {"single": partial(run_single, request), "per-draft": run_per_draft}
    modes: dict[str, Any] = {}
    seen = {}
    for mode, runner in runners.items():
        started = time.perf_counter()
        runs = runner(roles, partial(run_engine, request), lambda m: print(m, file=sys.stderr))
        wall = time.perf_counter() - started
        engines = runs.engines
        failed = [r for r in ROLES if not engines[r]["ok"]]
        if failed:
            raise SystemExit(
                f"{target.name} {mode}: {failed} failed:\n{engines[failed[0]]['log'][-2000:]}"
            )
        results = {r: engines[r]["result"] for r in ROLES}
        seen[mode] = {r: (results[r]["token_ids"], results[r]["metrics"]) for r in ROLES}
        modes[mode] = {
            "mode_ran": runs.mode,
            "fallback": runs.fallback,
            "target_loads": runs.target_loads,
            "wall_s": round(wall, 1),
            "load_s": {r: results[r]["load_s"] for r in ROLES},
            "generate_s": {r: results[r]["generate_s"] for r in ROLES},
        }
    return {
        "modes": modes,
        "wall_ratio_single_over_per_draft": round(
            modes["single"]["wall_s"] / modes["per-draft"]["wall_s"], 3
        ),
        "same_outputs_and_counters": seen["single"] == seen["per-draft"],
    }


def main() -> None:
    from eaglequant.devtools.toy import deepen_target
    from eaglequant.validate.validation import read_prompts

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=HERE / "results-validate-engines.json")
    args = parser.parse_args()
    prompts = read_prompts(TOY / "prompts.jsonl")[: args.prompts]
    with tempfile.TemporaryDirectory(prefix="validate-engines-bench-") as scratch:
        fp8 = export_fp8(Path(scratch) / "fp8")
        deep = deepen_target(TOY / "target", Path(scratch) / "deep", ADDED_LAYERS)
        targets = {"toy": TOY / "target", f"toy-deep-{4 + ADDED_LAYERS}-layers": deep}
        results = {
            "prompts": len(prompts),
            "max_tokens": args.max_tokens,
            "targets": {n: measure(t, fp8, prompts, args.max_tokens) for n, t in targets.items()},
        }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
