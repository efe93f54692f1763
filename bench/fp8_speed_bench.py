"""The static FP8 draft's generation speed against the BF16 draft's, on both CPU kinds.

On the toy pair, each configuration starts its own vLLM engine (a child process, the
engine core in it), generates once to warm up, then ``--rounds`` times over the same
prompts (greedy, ``--max-tokens`` each, k=3); its time is the fastest round. Recorded per
configuration: tokens per second, the FP8 linears' kernel as vLLM chose it, mean
acceptance length and a hash of the generated tokens. With ``--cycles N`` the
configurations run in turn N times, each time in a fresh engine, and each keeps its
fastest engine (two engines of one configuration differed by 8% at 0.3 s rounds).

Configurations, on this CPU and on it simulated as an AVX2 EPYC (``tests/as_avx2``: no
AVX-512, no native BF16, oneDNN limited to AVX2, vLLM's ``_C_AVX2`` kernels):

- ``bf16``: the BF16 draft;
- ``fp8``: the static FP8 export as eaglequant's engines run it: vLLM's W8A16 AMX kernel
  switched off (``VLLM_DISABLED_KERNELS``, so the inputs are quantized as on a GPU), vLLM's
  torch FP8 kernel with the plugin's GEMM over the FP8 values in its default dtype (float32);
- ``fp8-gemm-float32`` and ``fp8-gemm-bfloat16``: the same with that dtype forced;
- ``fp8-vllm-w8a16``: vLLM's own pick (on an AMX CPU its W8A16 kernel: inputs unquantized);
- ``fp8-scaled-mm``: vLLM's torch FP8 kernel with ``torch._scaled_mm`` (the plugin's GEMM
  skipped), what ran before; stopped after ``--scaled-mm-s`` seconds.

The BF16 and float32 GEMMs must give the same tokens (the target's); their acceptance is
compared (float32 is the FP8 arithmetic, BF16 rounds the GEMM's result once more).

    python bench/fp8_speed_bench.py [--prompts 16] [--max-tokens 64] [--rounds 3] \
        [--out bench/results-fp8-speed-toy.json]
    # another pair (the prompts stay the toy's plain-text ones: speed, not quality):
    python bench/fp8_speed_bench.py --target out/demo/pair/target \
        --bf16 out/demo/pair/draft --fp8 out/demo/draft-fp8 --label smollm2 \
        --kinds native --out bench/results-fp8-speed-smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from toy_pair import TOY, export_fp8  # a sibling module: bench/ is on the path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

MAX_RSS_GIB, MAX_SECONDS = 12.0, 300.0  # a configuration past either is stopped and recorded
W8A16_OFF = {"VLLM_DISABLED_KERNELS": "CPUFp8PerTensorScaledMMLinearKernel"}
AS_AVX2 = {
    "PYTHONPATH": str(REPO / "tests" / "as_avx2"),
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "TORCHINDUCTOR_CACHE_DIR": str(REPO / "build" / "inductor-as-avx2"),
}
CONFIGS = {
    "bf16": ("bf16", {}),
    "fp8": ("fp8", W8A16_OFF),
    "fp8-gemm-float32": ("fp8", W8A16_OFF | {"EAGLEQUANT_CPU_FP8_GEMM": "float32"}),
    "fp8-gemm-bfloat16": ("fp8", W8A16_OFF | {"EAGLEQUANT_CPU_FP8_GEMM": "bfloat16"}),
    "fp8-vllm-w8a16": ("fp8", {}),
    "fp8-scaled-mm": ("fp8", W8A16_OFF | {"EAGLEQUANT_CPU_PLUGIN_SKIP": "plain_fp8_gemm"}),
}
RUN = """
import hashlib, json, sys, time
from vllm import LLM, SamplingParams
from eaglequant.engine import vllm_internals
draft, prompts, max_tokens, rounds, out = sys.argv[1:6]
prompts = json.loads(prompts)
llm = LLM(sys.argv[6], max_model_len=1024, enforce_eager=True, seed=0, disable_log_stats=False,
          speculative_config={"model": draft, "method": "eagle3", "num_speculative_tokens": 3})
def kernels(worker):
    model = vllm_internals.draft_model(worker)
    found = {type(getattr(m.scheme, "fp8_linear", None)).__name__
             for _, m in model.named_modules() if getattr(m, "scheme", None) is not None}
    return sorted(found - {"NoneType"})
params = SamplingParams(temperature=0, max_tokens=int(max_tokens), ignore_eos=True)
llm.generate(prompts, params, use_tqdm=False)
times = []
for _ in range(int(rounds)):
    began = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    times.append(time.perf_counter() - began)
counts = {m.name: m.value for m in llm.get_metrics() if m.name in (
    "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens")}
tokens = [list(o.outputs[0].token_ids) for o in outputs]
json.dump({
    "seconds": round(min(times), 4),
    "rounds_s": [round(t, 4) for t in times],
    "tokens_per_s": round(sum(map(len, tokens)) / min(times), 1),
    "kernels": llm.collective_rpc(kernels)[0],
    "mean_acceptance_length": round(1 + counts["vllm:spec_decode_num_accepted_tokens"]
                                    / counts["vllm:spec_decode_num_drafts"], 4),
    "tokens_sha256": hashlib.sha256(json.dumps(tokens).encode()).hexdigest(),
}, open(out, "w"))
"""
# --one-engine: the BF16 and the FP8 draft in one engine (the target loaded once), swapped in
# turn as validate swaps them, rounds alternating ABBA; each round pair gives a ratio.
RUN_ONE = """
import hashlib, json, sys, time
from vllm import LLM, SamplingParams
from eaglequant.rules.speculative import speculative_config
drafts, prompts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
max_tokens, rounds, out, target = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
names = list(drafts)
llm = LLM(target, max_model_len=1024, enforce_eager=True, seed=0, disable_log_stats=False,
          speculative_config=speculative_config(drafts[names[0]], 3),
          worker_extension_cls="eaglequant.validate.engine_run.DraftInspector")
params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
NAMES = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens")
def counters():
    found = {m.name: m.value for m in llm.get_metrics() if m.name in NAMES}
    return [found[n] for n in NAMES]
current = names[0]
def use(name):
    global current
    if name != current:
        spec = speculative_config(drafts[name], 3)
        answers = llm.collective_rpc("eaglequant_swap_draft", args=(spec,))
        refused = [a["reason"] for a in answers if not a["ok"]]
        if refused:
            raise SystemExit("swap refused: " + refused[0])
        llm.reset_prefix_cache()
        current = name
runs = {name: {"rounds_s": [], "drafts": 0, "accepted": 0} for name in names}
for name in names:  # warm-up: each draft once, untimed
    use(name)
    llm.generate(prompts, params, use_tqdm=False)
for r in range(rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
        use(name)
        before = counters()
        began = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        runs[name]["rounds_s"].append(round(time.perf_counter() - began, 4))
        after = counters()
        runs[name]["drafts"] += after[0] - before[0]
        runs[name]["accepted"] += after[1] - before[1]
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        runs[name]["tokens"] = sum(map(len, tokens))
        runs[name]["tokens_sha256"] = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()
from eaglequant.engine import cpu_fp8_gemm, cpu_fp8_native
mode = cpu_fp8_gemm.gemm_mode()
if mode not in ("auto", "native"):
    static_path = f"vLLM's oneDNN GEMM ({mode})"
elif cpu_fp8_native.kernel() is not None:
    static_path = "eaglequant's compiled kernel"
else:
    static_path = f"vLLM's oneDNN GEMM, scales folded ({cpu_fp8_native.unavailable()})"
json.dump({"runs": runs, "fp8_static_path": static_path}, open(out, "w"))
"""


def measure_one_engine(
    drafts: dict[str, Path], env: dict[str, str], args: argparse.Namespace, prompts: list[str]
) -> Any:
    """Both drafts in one engine, rounds alternating; per draft its round times, acceptance
    and tokens, and the per-round-pair speed ratios (each draft's over the first's)."""
    with tempfile.TemporaryDirectory(prefix="eaglequant-bench-") as scratch:
        out = Path(scratch) / "out.json"
        argv = [sys.executable, "-c", RUN_ONE, json.dumps({k: str(v) for k, v in drafts.items()})]
        argv += [json.dumps(prompts), str(args.max_tokens), str(args.rounds), str(out)]
        argv += [str(args.target)]
        base = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_TARGET_DEVICE="cpu")
        base.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        log = Path(scratch) / "log"
        with log.open("w") as sink:
            child = subprocess.Popen(argv, env=base | env, stdout=sink, stderr=sink, cwd=REPO)
            stopped = _watch(child, MAX_SECONDS * (2 + args.rounds))
        if stopped or child.returncode != 0 or not out.is_file():
            lines = log.read_text(errors="replace").splitlines()
            errors = [line for line in lines if "Error" in line or "refused" in line]
            return {"failed": stopped or (errors or lines or ["no output"])[-1][:300]}
        found = json.loads(out.read_text())
    runs = found["runs"]
    first, *others = list(drafts)
    for run in runs.values():
        run["seconds"] = min(run["rounds_s"])
        run["tokens_per_s"] = round(run["tokens"] / run["seconds"], 1)
        run["mean_acceptance_length"] = round(1 + run.pop("accepted") / run.pop("drafts"), 4)
    ratios: dict[str, Any] = {}
    for name in others:
        pairs = [
            b / f for b, f in zip(runs[first]["rounds_s"], runs[name]["rounds_s"], strict=True)
        ]
        low, high = _median_interval(pairs)
        ratios[f"{name}_over_{first}"] = {
            "median": round(statistics.median(pairs), 3),
            "median_interval_95": [round(low, 3), round(high, 3)],
            f"at_least_{args.bar}": _verdict(low, high, args.bar),
            "fastest_over_fastest": round(runs[first]["seconds"] / runs[name]["seconds"], 3),
            "round_pairs": [round(p, 3) for p in pairs],
            "same_tokens": runs[name]["tokens_sha256"] == runs[first]["tokens_sha256"],
        }
    return {"runs": runs, "ratios": ratios, "fp8_static_path": found["fp8_static_path"]}


def _median_interval(pairs: list[float], resamples: int = 4000) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median round-pair ratio (seeded: the same
    rounds give the same interval)."""
    import random

    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(pairs, k=len(pairs))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def _verdict(low: float, high: float, bar: float) -> str:
    return "yes" if low >= bar else "no" if high < bar else "undecided"


def measure(
    draft: Path, env: dict[str, str], args: argparse.Namespace, prompts: list[str], limit_s: float
) -> Any:
    with tempfile.TemporaryDirectory(prefix="eaglequant-bench-") as scratch:
        out = Path(scratch) / "out.json"
        argv = [sys.executable, "-c", RUN, str(draft), json.dumps(prompts)]
        argv += [str(args.max_tokens), str(args.rounds), str(out), str(args.target)]
        base = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_TARGET_DEVICE="cpu")
        base.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        log = Path(scratch) / "log"
        with log.open("w") as sink:
            child = subprocess.Popen(argv, env=base | env, stdout=sink, stderr=sink, cwd=REPO)
            stopped = _watch(child, limit_s)
        if stopped:
            return {"failed": stopped}
        if child.returncode != 0 or not out.is_file():
            lines = log.read_text(errors="replace").splitlines()
            errors = [line for line in lines if "Error" in line]
            return {"failed": (errors or lines or ["no output"])[-1][:300]}
        return json.loads(out.read_text())


def _watch(child: subprocess.Popen, limit_s: float) -> str:
    """Wait for ``child``; stop it when its memory or time passes the bounds ("" if it ended)."""
    started = time.monotonic()
    while child.poll() is None:
        status = Path(f"/proc/{child.pid}/status").read_text(errors="replace")
        rss_gib = int(status.split("VmRSS:")[1].split()[0]) / 2**20 if "VmRSS:" in status else 0
        seconds = time.monotonic() - started
        if rss_gib > MAX_RSS_GIB or seconds > limit_s:
            child.kill()
            child.wait()
            return f"stopped after {seconds:.0f} s at {rss_gib:.1f} GiB resident"
        time.sleep(0.5)
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cycles",
        type=int,
        default=1,
        help="run the configurations in turn this many times, each its own engine each time; "
        "a configuration's time is its fastest engine's (engines differ by more than rounds do)",
    )
    parser.add_argument("--scaled-mm-s", type=float, default=120.0)
    parser.add_argument("--target", type=Path, default=TOY / "target")
    parser.add_argument("--bf16", type=Path, default=TOY / "draft", help="the BF16 draft")
    parser.add_argument("--fp8", type=Path, help="its FP8 export (default: made from the toy)")
    parser.add_argument("--label", default="toy (examples/toy)", help="the pair, as recorded")
    parser.add_argument(
        "--kinds", nargs="+", default=["native", "as-avx2"], choices=["native", "as-avx2"]
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        default=list(CONFIGS),
        choices=list(CONFIGS),
        help="the configurations to run (bf16 is always run: the ratios are over it)",
    )
    parser.add_argument(
        "--one-engine",
        action="store_true",
        help="bf16 and fp8 only, both drafts in one engine (the target loaded once), swapped "
        "in turn, rounds alternating: no engine-to-engine spread in the ratio",
    )
    parser.add_argument(
        "--bar", type=float, default=0.9, help="--one-engine: the FP8/BF16 ratio judged against"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results-fp8-speed-toy.json")
    args = parser.parse_args()
    from eaglequant.results.environment import cpu_info, versions

    lines = (TOY / "prompts.jsonl").read_text().splitlines()[: args.prompts]  # plain text
    prompts = [json.loads(line)["text"] for line in lines]
    kinds: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="eaglequant-bench-") as scratch:
        fp8 = args.fp8 or export_fp8(Path(scratch) / "fp8")
        drafts = {"bf16": args.bf16, "fp8": fp8}
        for kind, kind_env in (("native", {}), ("as-avx2", AS_AVX2)):
            if kind not in args.kinds:
                continue
            if args.one_engine:
                kinds[kind] = measure_one_engine(drafts, kind_env | W8A16_OFF, args, prompts)
                print(kind, json.dumps(kinds[kind].get("ratios", kinds[kind])), flush=True)
                continue
            cycles: dict[str, list[Any]] = {}
            for cycle in range(args.cycles):
                for name, (draft, env) in CONFIGS.items():
                    if name != "bf16" and name not in args.configs:
                        continue
                    limit = args.scaled_mm_s if name == "fp8-scaled-mm" else MAX_SECONDS
                    run = measure(drafts[draft], kind_env | env, args, prompts, limit)
                    cycles.setdefault(name, []).append(run)
                    print(kind, f"cycle {cycle + 1}", name, json.dumps(run), flush=True)
            runs = {name: _fastest(found) for name, found in cycles.items()}
            kinds[kind] = {"runs": runs, "ratios": _ratios(runs)}
    result = {
        "bench": "fp8_speed",
        "pair": f"{args.label}, k=3, greedy",
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "cycles": args.cycles,
        "one_engine": args.one_engine,
        "fp8_gemm_mode": os.environ.get("EAGLEQUANT_CPU_FP8_GEMM") or "auto",
        "cpu": cpu_info(),
        "versions": versions(),
        "kinds": kinds,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v.get("ratios", v) for k, v in kinds.items()}, indent=2))


def _fastest(cycles: list[Any]) -> Any:
    """A configuration's fastest engine over the cycles, every cycle's time beside it (an
    engine that failed in any cycle is recorded as failed)."""
    failed = [run for run in cycles if "failed" in run]
    if failed:
        return failed[0]
    best = dict(min(cycles, key=lambda run: run["seconds"]))
    best["cycles_s"] = [run["seconds"] for run in cycles]
    return best


def _ratios(runs: dict[str, Any]) -> dict[str, Any]:
    """Each FP8 configuration's generation speed over the BF16 draft's, and whether the two
    torch-kernel GEMMs gave the same tokens and acceptance."""
    bf16 = runs["bf16"].get("tokens_per_s")
    ratios: dict[str, Any] = {
        f"{name}_over_bf16": round(run["tokens_per_s"] / bf16, 3)
        for name, run in runs.items()
        if name != "bf16" and bf16 and "tokens_per_s" in run
    }
    one, other = runs.get("fp8-gemm-float32", {}), runs.get("fp8-gemm-bfloat16", {})
    if "tokens_sha256" in one and "tokens_sha256" in other:
        ratios["bfloat16_gemm_same_tokens_as_float32"] = (
            one["tokens_sha256"] == other["tokens_sha256"]
        )
        ratios["acceptance_float32_gemm"] = one["mean_acceptance_length"]
        ratios["acceptance_bfloat16_gemm"] = other["mean_acceptance_length"]
    return ratios


if __name__ == "__main__":
    main()
