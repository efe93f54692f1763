"""False failures of the gate: `eaglequant validate` of good drafts, many times, FAILs counted.

Each run validates one good draft (an export of a BF16 draft by a shipped recipe) against
that BF16 draft on a sample of a prompt set, varying what legitimately changes the engine's
batch shapes: the prompts and their order (a seeded sample), ``max_num_seqs``, k, and some
runs sampled at a temperature. A good draft must pass every check; each FAIL (or
undecided check) of a run is counted by check. Each run is checkpointed as one JSON file in
``OUT/runs/`` the moment it ends, so the bench resumes where it stopped (``--runs N`` grows
the plan; runs already recorded are kept), and the summary is rebuilt from those files.

Check 1 is counted three ways on the same observations (each run's recorded flips): as the run
judged it, by the exact-prefix rule check 1 had before its population test (``exact_prefix``
below: a candidate's flip above the tie margin passes only where the control's run generated
the same prefix and token), and by the rule installed now
(``eaglequant.validate.lossless.rejudge``). Checks 2 and 5, and both by category, are also
judged again by the installed rule from each greedy run's recorded per-prompt counts (runs
recorded before the counts were kept, and sampled runs, count as they ran).

    python bench/false_failure_bench.py --pair PAIR --capture CAPTURE \
        --draft fp8-static=DIR --draft ptpc-fp8=DIR ... [--runs 48] [--prompts 32] \
        [--max-tokens 64] [--out bench/results-false-failures]

PAIR holds ``target`` and ``draft`` (the BF16 draft the drafts were exported from), as
``eaglequant example smollm2 PAIR`` writes it; CAPTURE is ``eaglequant capture``'s folder for
check 6.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eaglequant.prompts.source import load_prompts, parse_source
from eaglequant.recipe import ValidationSpec
from eaglequant.results.environment import cpu_info
from eaglequant.validate.acceptance_checks import AcceptanceThresholds, acceptance_checks
from eaglequant.validate.categories import by_category, category_checks
from eaglequant.validate.lossless import rejudge
from eaglequant.validate.stats import PromptCounts

EAGLEQUANT = Path(sys.executable).parent / "eaglequant"
SETS = ("mt-bench", "humaneval", "sharegpt")
POOL = 400  # ShareGPT's prompts are drawn from its first POOL (the others: the whole set)
KS = (2, 3, 5)
MAX_NUM_SEQS = (4, 16, 256)  # 256: vLLM's CPU default
SAMPLED_EVERY = 6  # every sixth run also sampled at TEMPERATURE (checks 2 and 5 on it)
TEMPERATURE = 0.7
# Generous for a shared machine (an engine here takes about 2 minutes); an engine that hangs
# (a crashed vLLM process can deadlock in a library's signal handler) fails its run after it.
ENGINE_TIMEOUT_S = 900
# ShareGPT's pool holds prompts of up to 5,925 tokens with the chat template (14 over 1,984;
# the CPU default context, 1,024, refuses 1 in 20).
MAX_MODEL_LEN = 8192


def plan(index: int, recipes: list[str]) -> dict[str, Any]:
    """Run ``index``'s settings: every recipe meets every k and batch size over the runs."""
    return {
        "run": index,
        "recipe": recipes[index % len(recipes)],
        "prompts": SETS[(index // len(recipes)) % len(SETS)],
        "k": KS[index % len(KS)],
        "max_num_seqs": MAX_NUM_SEQS[(index // len(KS)) % len(MAX_NUM_SEQS)],
        "seed": index,
        "temperature": TEMPERATURE if index % SAMPLED_EVERY == SAMPLED_EVERY - 1 else 0.0,
    }


def prompts_file(folder: Path, name: str, count: int, seed: int) -> Path:
    """``count`` prompts of the set drawn (and so ordered) by ``seed``, with their categories."""
    prompts = load_prompts(parse_source(name)).prompts
    pool = prompts[:POOL] if name == "sharegpt" else prompts
    chosen = random.Random(seed).sample(range(len(pool)), count)
    path = folder / "prompts.jsonl"
    lines = [
        json.dumps({"text": pool[n].text, "category": pool[n].category or name, "index": n})
        for n in chosen
    ]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def validate(settings: dict[str, Any], args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """One validation in its own process; what a summary needs of its report."""
    prompts = prompts_file(scratch, settings["prompts"], args.prompts, settings["seed"])
    report_path = scratch / "report.json"
    command = [
        *args.wrap, str(EAGLEQUANT), "validate", "--target", str(args.pair / "target"),
        "--draft", str(args.drafts[settings["recipe"]]), "--baseline", str(args.pair / "draft"),
        "--prompts", str(prompts), "--k", str(settings["k"]),
        "--max-tokens", str(args.max_tokens), "--hidden-states", str(args.capture),
        "--engine-arg", f"max_num_seqs={settings['max_num_seqs']}", "--json", str(report_path),
        "--engine-timeout", str(ENGINE_TIMEOUT_S), "--max-model-len", str(MAX_MODEL_LEN),
    ]  # fmt: skip
    if settings["temperature"]:
        command += ["--temperature", str(settings["temperature"]), "--seed", str(settings["seed"])]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    record: dict[str, Any] = {
        **settings,
        "exit": done.returncode,
        "wall_s": round(time.perf_counter() - began, 1),
        "code": commit(),
    }
    if done.returncode not in (0, 1) or not report_path.exists():
        record["error"] = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return record
    report = json.loads(report_path.read_text())
    record["checks"] = {c["name"]: _check(c) for c in report["checks"]}
    record["categories"] = {
        name: {n: c["verdict"] for n, c in row.get("checks", {}).items()}
        for name, row in (report.get("categories") or {}).items()
    }
    record["prompt_indices"] = [json.loads(line)["index"] for line in prompts.open()]
    if not settings["temperature"]:  # the report keeps the greedy runs' per-prompt counts
        record["per_prompt"] = {r: report["engines"][r].get("per_prompt") for r in ROLES}
        record["prompt_categories"] = report.get("prompt_categories")
    return record


ROLES = ("bf16", "fp8")
ACCEPTANCE_CHECKS = ("2 acceptance", "5 per-position")
CATEGORY_CHECKS = ("2 acceptance by category", "5 per-position by category")


def acceptance_rejudged(run: dict[str, Any]) -> dict[str, str] | None:
    """Checks 2 and 5, and both by category, judged by the installed rule from the run's
    per-prompt counts (None for a run that kept none)."""
    counts = run.get("per_prompt")
    if not counts or any(not counts.get(role) or None in counts[role] for role in ROLES):
        return None
    prompts = {role: [PromptCounts.from_json(c) for c in counts[role]] for role in ROLES}
    spec = ValidationSpec()
    thresholds = AcceptanceThresholds(
        min_acceptance_ratio=spec.min_acceptance_ratio,
        min_position_ratio=spec.min_position_ratio,
    )
    checks = list(acceptance_checks(prompts["fp8"], prompts["bf16"], thresholds))
    if run.get("prompt_categories"):
        table = by_category(
            run["prompt_categories"],
            prompts,
            min_drafts=spec.min_category_drafts,
            thresholds=thresholds,
        )
        checks += category_checks(table)
    return {str(c.name): c.verdict for c in checks}


def _check(check: dict[str, Any]) -> dict[str, Any]:
    """A check's verdict and detail; check 1's recorded flips too (to re-judge them)."""
    kept = {"verdict": check["verdict"], "detail": check["detail"]}
    if check["name"].startswith("1 "):
        kept["numbers"] = check["numbers"]
    return kept


def exact_prefix_fails(numbers: dict[str, Any]) -> bool:
    """Whether check 1 fails by the exact-prefix rule: any flip of a candidate's run above the
    tie margin (or, where judged in steps, above the steps) that the control did not share, or
    any unscored run."""
    reference, margin, steps = numbers["paired_with"], numbers["tie_margin"], numbers["tie_steps"]
    for flip in numbers["divergences"]:
        if flip["prompt"] < 0 or not flip["ranked"] or flip["margin"] is None:
            return True
        tied = flip["margin"] <= margin or bool(steps and (flip["steps"] or 1e9) <= steps)
        shared = flip.get("shared") if "shared" in flip else flip["verdict"] == "paired"
        if flip["draft"] != reference and not tied and not shared:
            return True
    return False


def machine() -> dict[str, Any]:
    """The CPU the runs shared (model, cores, the ISA flags that pick vLLM's CPU kernels)."""
    info = cpu_info()
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    flags = [f for f in wanted if f in info["isa_flags"]]
    return {"cpu": info["model"], "cores": os.cpu_count(), "flags": flags}


def commit() -> str:
    """The checkout's commit, for dating the summary (the runs each ran at their own time)."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def write_atomic(path: Path, data: Any) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(data, f, indent=1)
    os.replace(f.name, path)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """FAILs (and undecided verdicts) per check over the runs, check 1 as run and re-judged."""
    ran = [r for r in runs if "checks" in r]
    failures: dict[str, int] = {}
    undecided: dict[str, int] = {}
    for run in ran:
        sampled = " (sampled runs)" if run["temperature"] else ""
        for name, check in run["checks"].items():
            if check["verdict"] == "FAIL":
                failures[name + sampled] = failures.get(name + sampled, 0) + 1
            elif check["verdict"] != "PASS":
                undecided[name + sampled] = undecided.get(name + sampled, 0) + 1
    rejudged_acceptance: dict[str, int] = {}
    for run in ran:
        verdicts = acceptance_rejudged(run) or {
            name: run["checks"][name]["verdict"]
            for name in (*ACCEPTANCE_CHECKS, *CATEGORY_CHECKS)
            if name in run["checks"]
        }
        sampled = " (sampled runs)" if run["temperature"] else ""
        for name, verdict in verdicts.items():
            if verdict == "FAIL":
                rejudged_acceptance[name + sampled] = rejudged_acceptance.get(name + sampled, 0) + 1
    lossless = [r["checks"].get("1 lossless") for r in ran]
    rejudged = [rejudge(c["numbers"]) for c in lossless if c and "numbers" in c]
    failed_now = [r for r, ok in zip(ran, rejudged, strict=False) if not ok.passed]
    before = [
        r["run"]
        for r, c in zip(ran, lossless, strict=True)
        if c and exact_prefix_fails(c["numbers"])
    ]
    control = [
        f["margin"]
        for c in lossless
        if c
        for f in c["numbers"]["divergences"]
        if f["draft"] == c["numbers"]["paired_with"] and f["margin"] is not None
    ]
    return {
        "runs": len(ran),
        "sampled_runs": sum(bool(r["temperature"]) for r in ran),
        "errors": [{"run": r["run"], "error": r["error"]} for r in runs if "error" in r],
        "fails_as_run": failures,
        "undecided_as_run": undecided,
        "check_1_fails_exact_prefix": len(before),
        "check_1_exact_prefix_failing_runs": before,
        "check_1_fails_rejudged": len(failed_now),
        "control_flips": len(control),
        "control_flip_margins": {str(m): control.count(m) for m in sorted(set(control))},
        "check_1_rejudged_failing_runs": [
            {"run": r["run"], "recipe": r["recipe"], "detail": ok.detail}
            for r, ok in zip(ran, rejudged, strict=False)
            if not ok.passed
        ],
        "checks_2_5_fails_rejudged": rejudged_acceptance,
        "runs_with_counts_rejudged": sum(acceptance_rejudged(r) is not None for r in ran),
        "runs_failing_any_check": sum(
            any(c["verdict"] != "PASS" for c in r["checks"].values()) for r in ran
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, required=True)
    parser.add_argument("--capture", type=Path, required=True)
    parser.add_argument("--draft", action="append", required=True, metavar="RECIPE=DIR")
    parser.add_argument("--runs", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench/results-false-failures"))
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument(
        "--lock", type=Path, help="hold this file's lock (flock) during each validation only"
    )
    args = parser.parse_args()
    args.drafts = dict(d.split("=", 1) for d in args.draft)
    args.wrap = ["flock", str(args.lock)] if args.lock else []
    recipes = list(args.drafts)
    folder = args.out / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(args.runs if not args.summary_only else 0):
        path = folder / f"{index:03d}.json"
        if path.exists():
            continue
        settings = plan(index, recipes)
        with tempfile.TemporaryDirectory() as scratch:
            record = validate(settings, args, Path(scratch))
        write_atomic(path, record)
        verdicts = {n: c["verdict"] for n, c in record.get("checks", {}).items()}
        failed = [n for n, v in verdicts.items() if v != "PASS"]
        print(f"run {index} {settings} {record['wall_s']}s failed={failed or record.get('error')}")
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    result = {
        "bench": "false_failure_bench",
        "machine": machine(),
        "code": commit(),
        "settings": {"prompts": args.prompts, "max_tokens": args.max_tokens, "recipes": recipes},
        **summary(runs),
    }
    write_atomic(args.out / "summary.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "errors"}, indent=1))


if __name__ == "__main__":
    main()
