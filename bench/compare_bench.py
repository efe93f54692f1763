"""Compare benchmark: ``eaglequant compare`` against export + validate once per candidate.

Both sides run on the toy pair with the same candidates, prompts and tokens, each
command in a fresh process, timed from outside (wall time) with the peak resident
memory of its largest process (GNU time's %M: the engines are child processes).
The compare side captures once, exports every candidate in one process and
starts the target-alone and BF16 engines once; the per-candidate side runs
``eaglequant export`` (its own capture) and ``eaglequant validate`` (its own three
engines and check-6 capture) for each. The acceptance both sides measured is kept
to show they agree.

    python bench/compare_bench.py [--recipes fp8-static,ptpc-fp8,mxfp4] [--prompts 8]
        [--max-tokens 24] [--draft examples/toy/draft-speculators] [--compare-only]
        [--out bench/results-compare.json]

``--compare-only`` runs the compare side alone (its table, wall time and peak memory).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOY = HERE.parent / "examples" / "toy"
EAGLEQUANT = Path(sys.executable).parent / "eaglequant"
GNU_TIME = "/usr/bin/time"


def timed(args: list[str]) -> dict[str, Any]:
    """Run one command; its wall time, exit status and the peak RSS of its largest process."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        started = time.perf_counter()
        command = [GNU_TIME, "-f", "%M", "-o", rss.name, *args]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        peak_kib = int(rss.read().strip().splitlines()[-1])
    if done.returncode not in (0, 1):
        raise SystemExit(f"{args[1]}: {done.stderr.strip().splitlines()[-1]}")
    return {
        "wall_s": round(wall, 1),
        "returncode": done.returncode,
        "peak_rss_mib": peak_kib // 1024,
    }


def prompts_file(folder: Path, count: int) -> Path:
    texts = [json.loads(line)["text"] for line in (TOY / "prompts.jsonl").read_text().splitlines()]
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:count]))
    return path


def run_compare(
    scratch: Path, draft: Path, recipes: list[str], prompts: Path, tokens: int
) -> dict[str, Any]:
    out = scratch / "compare"
    args = [str(EAGLEQUANT), "compare", str(draft), "--target", str(TOY / "target")]
    args += ["--prompts", str(prompts), "--recipes", ",".join(recipes), "--out", str(out)]
    args += ["--calib-data", str(TOY / "calibration.jsonl"), "--max-tokens", str(tokens)]
    run = timed(args)
    report = json.loads((out / "compare.json").read_text())
    run["acceptance"] = {row["recipe"]: row["mean_acceptance"] for row in report["rows"]}
    run["rows"] = {
        row["recipe"]: {k: row[k] for k in ("bytes_ratio", "acceptance_ratio", "verdict")}
        for row in report["rows"]
    }
    run["timings_s"] = report["timings_s"]
    run["target_loads"] = report["target_loads"]
    run["recommended"] = report["recommended"]
    return run


def run_each(
    scratch: Path, draft: Path, recipes: list[str], prompts: Path, tokens: int
) -> dict[str, Any]:
    total, runs = 0.0, {}
    for recipe in recipes:
        out = scratch / "each" / recipe
        out.parent.mkdir(parents=True, exist_ok=True)
        export = [str(EAGLEQUANT), "export", str(draft), str(out), "--recipe", recipe]
        export += ["--calib-target", str(TOY / "target")]
        export += ["--calib-data", str(TOY / "calibration.jsonl")]
        report = scratch / f"{recipe}.json"
        validate = [str(EAGLEQUANT), "validate", "--target", str(TOY / "target")]
        validate += ["--draft", str(out), "--baseline", str(draft), "--prompts"]
        validate += [str(prompts), "--max-tokens", str(tokens), "--json", str(report)]
        runs[recipe] = {"export": timed(export), "validate": timed(validate)}
        checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
        runs[recipe]["acceptance"] = checks.get("2 acceptance", {}).get("numbers", {}).get("fp8")
        total += runs[recipe]["export"]["wall_s"] + runs[recipe]["validate"]["wall_s"]
    return {"wall_s": round(total, 1), "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default="fp8-static,ptpc-fp8,mxfp4")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument(
        "--draft", type=Path, default=TOY / "draft", help="BF16 draft of the toy target"
    )
    parser.add_argument("--compare-only", action="store_true", help="skip the per-candidate side")
    parser.add_argument("--out", type=Path, default=HERE / "results-compare.json")
    args = parser.parse_args()
    recipes = args.recipes.split(",")
    with tempfile.TemporaryDirectory(prefix="compare-bench-") as scratch:
        folder = Path(scratch)
        prompts = prompts_file(folder, args.prompts)
        results = {
            "recipes": recipes,
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            "draft": args.draft.name,
            "compare": run_compare(folder, args.draft, recipes, prompts, args.max_tokens),
        }
        if not args.compare_only:
            results["export_and_validate_each"] = run_each(
                folder, args.draft, recipes, prompts, args.max_tokens
            )
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    if args.compare_only:
        compare = results["compare"]
        print(f"compare: {compare['wall_s']} s, peak {compare['peak_rss_mib']} MiB")
        for recipe in recipes:
            print(f"{recipe:20} acceptance {compare['acceptance'][recipe]}")
        return
    each = results["export_and_validate_each"]
    print(f"compare: {results['compare']['wall_s']} s; export + validate each: {each['wall_s']} s")
    for recipe in recipes:
        print(
            f"{recipe:20} acceptance compare {results['compare']['acceptance'][recipe]} "
            f"each {each['runs'][recipe]['acceptance']}"
        )


if __name__ == "__main__":
    main()
