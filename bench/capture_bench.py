"""Capture benchmark: the toy target's hidden states with transformers and with vLLM, side by side.

Each run is ``eaglequant capture`` in a fresh process on the same sequences
(``--samples`` x ``--seq-len`` tokens of the toy calibration text), timed from
outside (wall time) and from inside (``capture.json``: engine load and run time,
tokens/s of the run, peak resident memory of each engine's process tree). Runs:
transformers (float32), vLLM in the served dtype (BF16) at TP=1, and vLLM in
float32 at TP=1, TP=2 and DP=2, then the largest difference of each vLLM capture
from the transformers one (per layer, in units of one BF16 rounding step plus
2e-5 of the row's magnitude: <= 1 means equal up to storage rounding).

    python bench/capture_bench.py [--samples 64] [--seq-len 256] [--out bench/results-capture.json]
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
RUNS: dict[str, list[str]] = {
    "transformers": ["--engine", "transformers"],
    "vllm-bf16": ["--engine", "vllm"],
    "vllm-fp32": ["--engine", "vllm", "--engine-arg", "dtype=float32"],
    "vllm-fp32-tp2": [
        "--engine",
        "vllm",
        "--engine-arg",
        "dtype=float32",
        "--tensor-parallel-size",
        "2",
    ],
    "vllm-fp32-dp2": [
        "--engine",
        "vllm",
        "--engine-arg",
        "dtype=float32",
        "--data-parallel-size",
        "2",
    ],
}


def run_capture(out: Path, samples: int, seq_len: int, extra: list[str]) -> dict[str, Any]:
    eaglequant = Path(sys.executable).parent / "eaglequant"
    args = [str(eaglequant), "capture", "--target", str(TOY / "target")]
    args += ["--data", str(TOY / "calibration.jsonl"), str(out), "--draft", str(TOY / "draft")]
    args += ["--samples", str(samples), "--seq-len", str(seq_len), *extra]
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(extra)}: {done.stderr.strip().splitlines()[-1]}")
    info = json.loads((out / "capture.json").read_text())
    engine = info["engine"]
    replicas = engine.get("replicas", [engine])
    peak = [r["peak_rss_mib"] for r in replicas]
    return {
        "wall_s": round(wall, 1),
        "load_s": engine["load_s"],
        "run_s": engine["run_s"],
        "tokens": info["tokens"],
        "tokens_per_s": info["tokens_per_s"],
        "peak_rss_mib": peak,
    }


def worst_difference(reference: Path, other: Path, layers: int, width: int) -> list[float]:
    import torch
    from safetensors.torch import load_file

    a = load_file(str(reference / "hidden_states.safetensors"))["aux_hidden_states"].float()
    b = load_file(str(other / "hidden_states.safetensors"))["aux_hidden_states"].float()
    worst = []
    for layer in range(layers):
        part = slice(layer * width, (layer + 1) * width)
        x, y = a[..., part], b[..., part]
        row = x.abs().amax(dim=-1, keepdim=True)
        bound = 2.0**-7 * torch.maximum(x.abs(), y.abs()) + 2e-5 * row
        worst.append(round(float(((x - y).abs() / bound).max()), 3))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--out", type=Path, default=HERE / "results-capture.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"samples": args.samples, "seq_len": args.seq_len, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="capture-bench-") as scratch:
        for name, extra in RUNS.items():
            results["runs"][name] = run_capture(
                Path(scratch) / name, args.samples, args.seq_len, extra
            )
            print(name, results["runs"][name], flush=True)
        for name in RUNS:
            if name != "transformers":
                results["runs"][name]["worst_vs_transformers"] = worst_difference(
                    Path(scratch) / "transformers", Path(scratch) / name, 3, 256
                )
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    base = results["runs"]["transformers"]["tokens_per_s"]
    print(
        f"\n{'run':16} {'wall s':>7} {'load s':>7} {'tok/s':>9} {'x hf':>6} {'peak MiB':>10} worst"
    )
    for name, run in results["runs"].items():
        print(
            f"{name:16} {run['wall_s']:7.1f} {run['load_s']:7.1f} {run['tokens_per_s']:9.0f} "
            f"{run['tokens_per_s'] / base:6.2f} {sum(run['peak_rss_mib']):10.0f} "
            f"{run.get('worst_vs_transformers', '')}"
        )


if __name__ == "__main__":
    main()
