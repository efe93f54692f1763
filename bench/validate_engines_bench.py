"""Validate's engines: one target load against two and three, side by side.

For the toy pair and for the deeper toy target (56 zero layers more, so loading
and running the target weigh as they do beside a real draft), validate's engine
runs are made three ways on the same prompts: by validate's default (both drafts
in one engine that swaps them, check 1 from each run's output scored
teacher-forced in that engine: one target load), by ``--reference-engine`` (a
target-alone engine first: two) and by ``--engine-per-draft --reference-engine``
(an engine each: three). Each mode runs twice, the second round in reverse order
(a mode's first engine in a process pays one-time costs; other work on a shared
machine comes and goes); its wall time is the smaller. Recorded per mode: target
loads, both wall times, per round the seconds loading (engine start, or the
swap), generating and (teacher-forced) scoring, check 1's verdict, and whether
the modes gave the same tokens and spec-decode counters. Check 6's capture (one
more target load in any mode unless ``--hidden-states`` is given) is not part of
this.

    python bench/validate_engines_bench.py [--prompts 8] [--max-tokens 32] \
        [--out bench/results-validate-engines.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from toy_pair import TOY, export_fp8  # a sibling module: bench/ is on the path

HERE = Path(__file__).resolve().parent

ADDED_LAYERS = 56
ROLES = ("target", "bf16", "fp8")
DRAFTS = ROLES[1:]


def measure(target: Path, fp8: Path, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    from eaglequant.validate.lossless import lossless_check, teacher_forced_check
    from eaglequant.validate.request import ValidateRequest, engine_prompts
    from eaglequant.validate.single_engine import run_per_draft, run_single
    from eaglequant.validate.validation import run_engine

    request = ValidateRequest(
        target=target,
        draft=fp8,
        baseline=TOY / "draft",
        prompts=prompts,
        max_tokens=max_tokens,
        engine_timeout_s=900,
    )
    roles = [("target", None), ("bf16", request.baseline), ("fp8", request.draft)]
    reference = replace(request, reference_engine=True)  # the drafts' runs score nothing
    rendered = engine_prompts(request)
    runners = {
        "one-load": (request, partial(run_single, request, rendered), roles[1:]),
        "reference": (reference, partial(run_single, reference, rendered), roles),
        "per-draft": (reference, run_per_draft, roles),
    }
    modes: dict[str, Any] = {}
    seen = []
    names = list(runners)
    for mode in [*names, *reversed(names)]:  # two rounds, the second in reverse order
        asking, runner, asked = runners[mode]
        started = time.perf_counter()
        runs = runner(asked, partial(run_engine, asking), lambda m: print(m, file=sys.stderr))
        wall = time.perf_counter() - started
        engines = runs.engines
        ran = [r for r, _ in asked]
        failed = [r for r in ran if not engines[r]["ok"]]
        if failed:
            raise SystemExit(
                f"{target.name} {mode}: {failed} failed:\n{engines[failed[0]]['log'][-2000:]}"
            )
        results = {r: engines[r]["result"] for r in ran}
        seen.append({r: (results[r]["token_ids"], results[r]["metrics"]) for r in DRAFTS})
        if "target" in results:
            target_run = results["target"]
            drafts = {r: results[r]["token_ids"] for r in DRAFTS}
            check = lossless_check(target_run["token_ids"], target_run["top_logprobs"], drafts)
        else:
            forced = {r: (results[r]["token_ids"], results[r]["teacher_forced"]) for r in DRAFTS}
            check = teacher_forced_check(forced)
        record = modes.setdefault(mode, {"walls_s": [], "rounds": []})
        record["walls_s"].append(round(wall, 1))
        record["wall_s"] = min(record["walls_s"])
        record |= {
            "mode_ran": runs.mode,
            "fallback": runs.fallback,
            "target_loads": runs.target_loads,
            "check_1": {"passed": check.passed, "detail": check.detail},
        }
        record["rounds"].append(
            {
                "load_s": {r: results[r]["load_s"] for r in ran},
                "generate_s": {r: results[r]["generate_s"] for r in ran},
                "score_s": {r: results[r].get("score_s", 0.0) for r in ran},
            }
        )
    per_draft = modes["per-draft"]["wall_s"]
    return {
        "modes": modes,
        "wall_ratio_one_load_over_reference": round(
            modes["one-load"]["wall_s"] / modes["reference"]["wall_s"], 3
        ),
        "wall_ratio_one_load_over_per_draft": round(modes["one-load"]["wall_s"] / per_draft, 3),
        "same_outputs_and_counters": all(run == seen[0] for run in seen),
        "same_check_1_verdict": len({m["check_1"]["passed"] for m in modes.values()}) == 1,
    }


def main() -> None:
    from eaglequant.validate.validation import read_prompts
    from eaglequant_examples.toy import deepen_target

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
