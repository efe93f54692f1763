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
    cmd += [
        "--engine-arg",
        "dtype=float32",
        "--engine-arg",
        "max_num_seqs=8",
        "--out",
        str(out.resolve()),
    ]
    subprocess.run([*cmd, *extra], check=True, cwd=REPO)
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
    cmd += [
        "--serve-arg",
        "--enforce-eager",
        "--engine-arg",
        "max_num_seqs=8",
        "--out",
        str(out.resolve()),
    ]
    subprocess.run(cmd + ["--keep-servers"] * args.keep_servers, check=True, cwd=REPO)


def pair_sweep(
    pair: Path, out: Path, args: argparse.Namespace, *extra: str, draft: Path | None = None
) -> dict:
    """``tune`` on the real pair: random tokens of ISL/OSL, the ``--serve-arg`` given."""
    eaglequant = Path(sys.executable).parent / "eaglequant"
    cmd = [str(eaglequant), "tune", "--target", rel(pair / "target")]
    cmd += ["--draft", rel(draft or pair / "draft"), "--k", args.k]
    cmd += ["--concurrency", args.concurrency]
    cmd += ["--repeats", str(args.repeats), "--isl", str(args.isl), "--osl", str(args.osl)]
    cmd += ["--num-prompts", str(args.num_prompts), "--out", str(out.resolve())]
    cmd += [a for arg in args.serve_arg for a in ("--serve-arg", arg)]
    subprocess.run([*cmd, *extra], check=True, cwd=REPO)
    return json.loads((out / "results.json").read_text())


def grid_part(
    target: Path, draft: Path, ks: list[int], out: Path, args: argparse.Namespace, *engine_args: str
) -> None:
    """Part of the full grid: no speculation and each of ``ks`` served once (tune's own
    ``measure``: warm-up, rounds inside the server), each server's rows in its own file. No
    schedule server: the full grid is the single-k surface the prediction is held to."""
    import tempfile

    from eaglequant.cli.options import engine_settings
    from eaglequant.rules.speculative import speculative_config
    from eaglequant.tune.bench import BenchClient
    from eaglequant.tune.request import TuneRequest, check_request, serve_env, with_draft_kv_cache
    from eaglequant.tune.sweep import Configuration, measure

    os.chdir(REPO)
    request = TuneRequest(
        target=Path(rel(target)),
        draft=Path(rel(draft)),
        ks=tuple(ks),
        concurrencies=tuple(int(c) for c in args.concurrency.split(",")),
        isl=args.isl,
        osl=args.osl,
        prompts=None if args.prompts is None else Path(rel(args.prompts)),
        num_prompts=args.num_prompts,
        repeats=args.repeats,
        serve_args=tuple(args.serve_arg),
        engine=engine_settings(1, engine_args, None),
        out=out.resolve(),
    )
    request = with_draft_kv_cache(request)
    max_len = check_request(request)
    env = serve_env(request)
    out.mkdir(parents=True, exist_ok=True)
    part = "-".join(map(str, ks))
    with tempfile.TemporaryDirectory() as scratch, BenchClient(Path(scratch) / "client.log") as b:
        for k in ks if args.skip_none else (0, *ks):
            kv = request.draft_kv_cache_dtype
            spec = speculative_config(str(request.draft), k, kv) if k else None
            config = Configuration(label=f"k{k}" if k else "no-speculation", k=k, spec=spec)
            rows = measure(request, config, env, max_len, Path(scratch), print, b)
            record = [
                {
                    "k": r.k,
                    "concurrency": r.concurrency,
                    "runs": r.runs,
                    "acceptance_length": r.acceptance_length,
                    "per_position": r.per_position,
                }
                for r in rows
            ]
            name = f"k{k}.json" if k else f"k0-part-{part}.json"
            (out / name).write_text(json.dumps(record, indent=2) + "\n")


def against_grid(predicted: dict, grid: Path) -> dict:
    """``tune --predict``'s results against the full grid's servers: each prediction's error,
    the server-to-server spread of what both measured, and both recommendations."""
    from statistics import fmean

    from eaglequant.tune.choice import beats, best_single, winner

    servers: dict[tuple[int, int], list[list[float]]] = {}
    for path in sorted(grid.glob("k*.json")):
        for r in json.loads(path.read_text()):
            servers.setdefault((r["k"], r["concurrency"]), []).append(r["runs"])
    full = {point: [x for runs in found for x in runs] for point, found in servers.items()}
    points = []
    for p in predicted["prediction"]["points"]:
        truth = full.get((p["k"], p["concurrency"]))
        if truth is None:
            continue
        points.append(
            {
                "k": p["k"],
                "concurrency": p["concurrency"],
                "predicted": round(p["point"], 1),
                "interval": [round(p["low"], 1), round(p["high"], 1)],
                "full_grid": round(fmean(truth), 1),
                "full_grid_rounds": [round(x, 1) for x in truth],
                "error": round(p["point"] / fmean(truth) - 1, 4),
                "fitted": p["fitted"],
            }
        )
    errors = sorted(abs(p["error"]) for p in points if not p["fitted"])
    # The same configuration on different servers: the predict run's own servers against the
    # grid's, and the grid's no-speculation servers (one per part) against each other.
    ran = {(r["k"], r["concurrency"]): r["runs"] for r in predicted["results"]}
    spread = []
    for point, found in servers.items():
        means = [fmean(runs) for runs in found] + ([fmean(ran[point])] if point in ran else [])
        if len(means) > 1:
            spread.append(
                {
                    "k": point[0],
                    "concurrency": point[1],
                    "server_means": [round(m, 1) for m in means],
                    "spread": round(max(means) / min(means) - 1, 4),
                }
            )
    sweep: dict[int, dict[int, list[float]]] = {}
    for (k, c), runs in full.items():
        sweep.setdefault(c, {})[k] = runs
    winners = {str(c): winner(runs) for c, runs in sorted(sweep.items())}
    ks = sorted({k for k, _ in full if k})
    recommended = predicted["recommendation"]
    by_concurrency = {}
    for c, runs in sorted(sweep.items()):
        chosen = (
            recommended["k"]
            if not recommended["schedule"]
            else next(k for lo, hi, k in predicted["schedule"]["ranges"] if lo <= c <= hi)
        )
        best = runs[winner(runs)]
        by_concurrency[str(c)] = {
            "predict_run": chosen,
            "full_grid": winner(runs),
            "within_full_grid_intervals": chosen in runs and not beats(best, runs[chosen]),
        }
    return {
        "points": points,
        "median_abs_error": errors[len(errors) // 2] if errors else None,
        "server_to_server": spread,
        "largest_server_spread": max((s["spread"] for s in spread), default=None),
        "server_starts": {
            "full_grid": 1 + len(ks),
            "predict": predicted["prediction"]["server_starts"],
        },
        "recommendation": {
            "predict": recommended,
            "full_grid_winners": winners,
            "full_grid_best_single": best_single(sweep, (0, *ks)),
            "by_concurrency": by_concurrency,
        },
    }


def fit_on_grid(grid: Path) -> dict:
    """The prediction model fitted on the grid's own no-speculation and largest-k servers,
    against every other k of the grid: the model's error where no other server's noise
    enters, the acceptance it assumed against each k's own counters, and the grid's
    server-to-server spread (its no-speculation servers, one per part)."""
    from statistics import fmean

    from eaglequant.tune.choice import best_single, winner
    from eaglequant.tune.predict import Point, plan, predict, predicted_length

    rows: dict[tuple[int, int], list[dict]] = {}
    for path in sorted(grid.glob("k*.json")):
        for r in json.loads(path.read_text()):
            rows.setdefault((r["k"], r["concurrency"]), []).append(r)
    largest = max(k for k, _ in rows)
    ks = sorted({k for k, _ in rows if k})
    fitted = [
        Point(k, c, tuple(found[0]["runs"]), tuple(found[0]["per_position"]))
        for (k, c), found in rows.items()
        if k in (0, largest)
    ]
    predictions = {(p.k, p.concurrency): p for p in predict(fitted, ks)}
    points = []
    for (k, c), found in sorted(rows.items()):
        r, p = found[0], predictions[k, c]
        truth = fmean(r["runs"])
        assumed = predicted_length(rows[largest, c][0]["per_position"], k) if k else None
        points.append(
            {
                "k": k,
                "concurrency": c,
                "predicted": round(p.point, 1),
                "interval": [round(p.low, 1), round(p.high, 1)],
                "measured_rounds": [round(x, 1) for x in r["runs"]],
                "error": round(p.point / truth - 1, 4),
                "fitted": k in (0, largest),
                "acceptance_length": {
                    "from_largest_k": None if assumed is None else round(assumed, 3),
                    "measured": r["acceptance_length"] and round(r["acceptance_length"], 3),
                },
                "per_position": [round(a, 3) for a in r["per_position"]],
            }
        )
    errors = sorted(abs(p["error"]) for p in points if not p["fitted"])
    none = [
        {"concurrency": c, "server_means": [round(fmean(r["runs"]), 1) for r in found]}
        for (k, c), found in sorted(rows.items())
        if k == 0
    ]
    sweep: dict[int, dict[int, list[float]]] = {}
    for (k, c), found in rows.items():
        sweep.setdefault(c, {})[k] = found[0]["runs"]
    chosen = plan(list(predictions.values()), ks)
    return {
        "fitted_on": [0, largest],
        "points": points,
        "median_abs_error": errors[len(errors) // 2] if errors else None,
        "no_speculation_servers": none,
        "recommendation": {
            "grid_winners": {str(c): winner(r) for c, r in sorted(sweep.items())},
            "grid_best_single": best_single(sweep, (0, *ks)),
            "predicted_winners": {str(c): k for c, k in chosen.winners.items()},
            "predicted_schedule": chosen.schedule,
            "predicted_noisy": chosen.noisy,
        },
    }


def predicted_against_full(deep: Path, prompts: Path, args: argparse.Namespace) -> dict:
    """The full grid (one server per k, rounds inside), then ``tune --predict``."""
    if args.part in (None, "full"):
        ks = [int(k) for k in args.k.split(",")]
        grid_part(
            deep, TOY / "draft", ks, args.out / "full", args, "dtype=float32", "max_num_seqs=8"
        )
    if args.part in (None, "predicted"):
        sweep(deep, args.out / "predicted", prompts, args, "--predict")
    if args.part not in (None, "compare"):
        return {}
    predicted = json.loads((args.out / "predicted" / "results.json").read_text())
    return against_grid(predicted, args.out / "full")


def pair_run(args: argparse.Namespace) -> None:
    """``--pair``: the real pair, in parts that each fit one locked command."""
    args.k, args.concurrency = args.k or "1,2,3,4,6,8", args.concurrency or "1,4,16"
    args.out = args.out or HERE / "results-tune-smollm2"
    if args.part == "predicted":
        pair_sweep(args.pair, args.out / "predicted", args, "--predict")
    elif args.part == "baseline":
        extra = ["--predict", "--baseline", rel(args.pair / "draft")]
        fp8 = Path(args.fp8)
        pair_sweep(args.pair, args.out / "baseline-predicted", args, *extra, draft=fp8)
    elif args.part == "fit-grid":
        record = fit_on_grid(args.out / "full")
        (args.out / "fit-on-grid.json").write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(record, indent=2))
    elif args.part == "full":
        ks = [int(k) for k in (args.grid_ks or args.k).split(",")]
        grid_part(args.pair / "target", args.pair / "draft", ks, args.out / "full", args)
    else:
        predicted = json.loads((args.out / "predicted" / "results.json").read_text())
        record = against_grid(predicted, args.out / "full")
        (args.out / "predict.json").write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(record, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default=None, help="default: 2,3 (sweep), 3 (--baseline)")
    parser.add_argument("--concurrency", default=None, help="default: 1,4,8 (sweep), 1,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--isl", type=int, default=64)
    parser.add_argument("--osl", type=int, default=32)
    parser.add_argument("--baseline", action="store_true", help="the FP8 vs BF16 release table")
    parser.add_argument("--keep-servers", action="store_true")
    parser.add_argument("--predict", action="store_true", help="tune --predict vs the full sweep")
    parser.add_argument(
        "--pair", type=Path, help="a real pair's folder (eaglequant example smollm2 OUT)"
    )
    parser.add_argument("--fp8", type=Path, help="with --pair --part baseline: the FP8 draft")
    parser.add_argument(
        "--part",
        choices=["full", "predicted", "baseline", "compare", "fit-grid"],
        help="one part of --predict (or --pair) per call; compare reads the parts' results",
    )
    parser.add_argument("--grid-ks", help="with --part full: the ks of this part of the grid")
    parser.add_argument(
        "--skip-none", action="store_true", help="with --part full: no no-speculation server"
    )
    parser.add_argument("--serve-arg", action="append", default=[])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.prompts = None
    if args.pair is not None:
        pair_run(args)
        return
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
        args.prompts, args.serve_arg = prompts, ["--enforce-eager"]
        if args.part == "full":
            args.k = args.grid_ks or args.k
        record = predicted_against_full(deep, prompts, args)
        if not record:
            return
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
