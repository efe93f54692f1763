"""Tune benchmark: ``eaglequant tune`` on the toy draft with the toy target and a deeper copy of it.

Speculation pays where a target step costs many draft steps. The toy target
(4 layers, the draft's size) is too cheap for that on a CPU; the deeper copy
(``eaglequant_examples.toy.deepen_target``: 56 more layers that add exactly zero, so the
same next tokens and the same acceptance) is not. Both are swept with the same
draft, ks, concurrencies, prompts and repeats, in float32 (fast GEMMs on every
x86 CPU), and each sweep's Markdown table, schedule and recommendation are
printed side by side; ``--out`` gets both results.json files.

``--baseline`` measures the release table instead (``tune --baseline``) on the deeper
target: the toy draft's static FP8 export (run through the CPU FP8 plugin) against the
BF16 toy draft and no speculation, served in the target's BF16 (vLLM's quark method takes
no float32), servers restarted in every round unless ``--keep-servers``.

``--predict`` checks ``tune --predict`` on the deeper target: the full sweep and the
predicted one, side by side in one run; recorded (``predict.json``) are the prediction's
error at every point the full sweep measured, the server starts each spent, and whether
both recommend the same k at every concurrency.

    python bench/tune_bench.py [--k 2,3] [--concurrency 1,4,8] [--repeats 3] [--out DIR]
    python bench/tune_bench.py --baseline [--k 3] [--concurrency 1,4] [--keep-servers]
    python bench/tune_bench.py --predict [--k 1,2,3] [--concurrency 1,4,8] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TOY = REPO / "examples" / "toy"
CACHE = HERE / ".cache"
ADDED_LAYERS = 56


def rel(path: Path) -> str:
    """``path`` relative to the checkout, where tune runs: results name no machine path."""
    return os.path.relpath(path, REPO)


def sweep(target: Path, out: Path, prompts: Path, args: argparse.Namespace, *extra: str) -> dict:
    eaglequant = Path(sys.executable).parent / "eaglequant"
    cmd = [str(eaglequant), "tune", "--target", rel(target), "--draft", rel(TOY / "draft")]
    cmd += ["--k", args.k, "--concurrency", args.concurrency, "--repeats", str(args.repeats)]
    cmd += ["--isl", "64", "--osl", str(args.osl), "--prompts", rel(prompts)]
    cmd += ["--num-prompts", str(args.num_prompts), "--serve-arg", "--enforce-eager"]
    cmd += ["--engine-arg", "dtype=float32", "--engine-arg", "max_num_seqs=8"]
    subprocess.run([*cmd, "--out", str(out.resolve()), *extra], check=True, cwd=REPO)
    return json.loads((out / "results.json").read_text())


def fp8_draft() -> Path:
    """The toy draft's static FP8 export (calibrated on the toy target), made once."""
    out = CACHE / "toy-draft-fp8"
    if not (out / "eaglequant.json").is_file():
        eaglequant = Path(sys.executable).parent / "eaglequant"
        cmd = [str(eaglequant), "export", str(TOY / "draft"), str(out), "--overwrite"]
        cmd += ["--calib-target", str(TOY / "target"), "--calib-engine", "transformers"]
        cmd += ["--calib-data", str(TOY / "calibration.jsonl"), "--calib-samples", "8"]
        subprocess.run([*cmd, "--base-model", "toy/target"], check=True)
    return out


def comparison(target: Path, out: Path, prompts: Path, args: argparse.Namespace) -> None:
    eaglequant = Path(sys.executable).parent / "eaglequant"
    cmd = [str(eaglequant), "tune", "--target", rel(target), "--draft", rel(fp8_draft())]
    cmd += ["--baseline", rel(TOY / "draft"), "--k", args.k, "--concurrency", args.concurrency]
    cmd += ["--repeats", str(args.repeats), "--isl", "64", "--osl", str(args.osl)]
    cmd += ["--prompts", rel(prompts), "--num-prompts", str(args.num_prompts)]
    cmd += ["--serve-arg", "--enforce-eager", "--engine-arg", "max_num_seqs=8"]
    cmd += ["--out", str(out.resolve())]
    subprocess.run(cmd + ["--keep-servers"] * args.keep_servers, check=True, cwd=REPO)


def predicted_against_full(deep: Path, prompts: Path, args: argparse.Namespace) -> dict:
    """The full sweep, then ``--predict``: each prediction against the full sweep's point."""
    full = sweep(deep, args.out / "full", prompts, args)
    predicted = sweep(deep, args.out / "predicted", prompts, args, "--predict")
    measured = {(r["k"], r["concurrency"]): r["output_throughput"] for r in full["results"]}
    points = []
    for p in predicted["prediction"]["points"]:
        truth = measured[p["k"], p["concurrency"]]
        points.append(
            {
                "k": p["k"],
                "concurrency": p["concurrency"],
                "predicted": round(p["point"], 1),
                "interval": [round(p["low"], 1), round(p["high"], 1)],
                "full_sweep": round(truth, 1),
                "error": round(p["point"] / truth - 1, 4),
                "fitted": p["fitted"],
            }
        )
    errors = sorted(abs(p["error"]) for p in points if not p["fitted"])
    return {
        "points": points,
        "median_abs_error": errors[len(errors) // 2] if errors else None,
        "server_starts": {
            "full": 1 + len(full["ks"]),
            "predict": predicted["prediction"]["server_starts"],
        },
        "recommended_k": {"full": full["recommended_k"], "predict": predicted["recommended_k"]},
        "same_recommendation": full["recommended_k"] == predicted["recommended_k"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default=None, help="default: 2,3 (sweep), 3 (--baseline)")
    parser.add_argument("--concurrency", default=None, help="default: 1,4,8 (sweep), 1,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--osl", type=int, default=32)
    parser.add_argument("--baseline", action="store_true", help="the FP8 vs BF16 release table")
    parser.add_argument("--keep-servers", action="store_true")
    parser.add_argument("--predict", action="store_true", help="tune --predict vs the full sweep")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from eaglequant_examples.toy import deepen_target

    texts = [json.loads(line)["text"] for line in (TOY / "prompts.jsonl").read_text().splitlines()]
    CACHE.mkdir(parents=True, exist_ok=True)
    prompts = CACHE / "tune-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    deep = deepen_target(TOY / "target", CACHE / "toy-deep-target", ADDED_LAYERS)
    if args.baseline:
        args.k, args.concurrency = args.k or "3", args.concurrency or "1,4"
        out = (args.out or HERE / "results-tune-baseline") / "deep-target"
        comparison(deep, out, prompts, args)
        print("\n" + (out / "results.md").read_text())
        return
    if args.predict:
        args.k, args.concurrency = args.k or "1,2,3", args.concurrency or "1,4,8"
        args.out = args.out or HERE / "results-tune-predict"
        record = predicted_against_full(deep, prompts, args)
        (args.out / "predict.json").write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(record, indent=2))
        return
    args.k, args.concurrency = args.k or "2,3", args.concurrency or "1,4,8"
    args.out = args.out or HERE / "results-tune"
    for name, target in (("toy-target", TOY / "target"), ("deep-target", deep)):
        summary = sweep(target, args.out / name, prompts, args)
        print(f"\n# {name}: recommended {summary['recommendation']}\n", flush=True)
    for name in ("toy-target", "deep-target"):
        print(f"\n# {name}\n\n" + (args.out / name / "results.md").read_text())


if __name__ == "__main__":
    main()
