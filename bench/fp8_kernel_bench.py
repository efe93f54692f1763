"""One static FP8 draft layer's four linears on a CPU: each path, side by side in one run.

For the toy draft's shapes (hidden 256) and SmolLM2's draft's (hidden 576), at 4, 16 and 64
input rows (a decode step's drafts, and the first draft step over every verified token), the
midlayer's qkv, o, gate_up and down linears run in turn, as a draft step runs them:

- ``bf16``: the BF16 draft's linears, vLLM's oneDNN GEMM over BF16 weights;
- ``fp8-native``: eaglequant's compiled kernel (``cpu_fp8_native``: the input quantized
  inside, BF16 pairs into float32 sums, scales, one rounding), as the plugin calls it;
- ``fp8-folded``: the path without it: the 16-bit input lookup, then vLLM's oneDNN GEMM over
  the FP8 values times the scales in float32, writing BF16.

Per configuration the median of ``--repeats`` timings of ``--calls`` layer passes (the
configurations in turn), after a warm-up; in a warm loop, so each piece costs less than
inside an engine (``fp8_speed_bench.py`` measures generation). Needs vLLM (its oneDNN GEMM)
and AVX512-BF16.

    python bench/fp8_kernel_bench.py [--out bench/results-fp8-kernel.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DRAFTS = {"toy": (256, 768, 512), "smollm2": (576, 1536, 960)}  # hidden, intermediate, qkv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "results-fp8-kernel.json")
    args = parser.parse_args()
    import torch

    from eaglequant.engine import cpu_fp8_native
    from eaglequant.results.environment import cpu_info, versions

    kernel = cpu_fp8_native.kernel()
    if kernel is None:
        raise SystemExit(f"the kernel is not available here: {cpu_fp8_native.unavailable()}")
    torch.manual_seed(0)
    results: dict[str, Any] = {}
    for draft, (hidden, intermediate, qkv) in DRAFTS.items():
        shapes = [
            (2 * hidden, qkv),
            (hidden, hidden),
            (hidden, 2 * intermediate),
            (intermediate, hidden),
        ]
        for rows in args.rows:
            layers = [_layer(kernel, k, n, rows) for k, n in shapes]
            times = _times(layers, ("bf16", "fp8-native", "fp8-folded"), args)
            results[f"{draft}, {rows} rows"] = {
                "us_per_layer": {name: round(t, 1) for name, t in times.items()},
                "native_over_bf16": round(times["fp8-native"] / times["bf16"], 3),
                "folded_over_bf16": round(times["fp8-folded"] / times["bf16"], 3),
            }
            print(draft, rows, json.dumps(results[f"{draft}, {rows} rows"]), flush=True)
    report = {
        "bench": "fp8_kernel",
        "what": "one draft layer's qkv, o, gate_up and down linears, microseconds a pass",
        "calls": args.calls,
        "repeats": args.repeats,
        "cpu": cpu_info(),
        "versions": versions(),
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")


def _layer(kernel: Any, k: int, n: int, rows: int) -> dict[str, Any]:
    """One linear's three forms over the same random E4M3 weight and scales."""
    import torch
    from vllm import _custom_ops as ops

    from eaglequant.engine.cpu_fp8_gemm import _folded_gemm

    codes = torch.randint(0, 256, (n, k), dtype=torch.uint8)
    weight = codes.view(torch.float8_e4m3fn).float().nan_to_num(0.0).to(torch.float8_e4m3fn)
    input_scale = torch.tensor([0.02])
    scale = input_scale.reshape(1, 1) * (torch.rand(1, n) / 100 + 1e-4)
    table = torch.randn(65536)  # the lookup's cost, not its values
    return {
        "x": torch.randn(rows, k).bfloat16(),
        "n": n,
        "bf16": ops.create_onednn_mm(weight.bfloat16().t(), 32),
        "native": kernel.linear(weight.t(), scale, input_scale.reciprocal()),
        "folded": _folded_gemm(weight.t(), scale, 32),
        "table": table,
    }


def _pass(layers: list[dict[str, Any]], name: str) -> None:
    import torch

    for layer in layers:
        x = layer["x"]
        out = torch.empty(x.shape[0], layer["n"], dtype=torch.bfloat16)
        if name == "bf16":
            torch.ops._C.onednn_mm(out, x, None, layer["bf16"].handler_tensor)
        elif name == "fp8-native":
            layer["native"].into(out, x)
        else:
            bits = x.view(torch.uint16).to(torch.int32).view(-1)
            layer["folded"](out, torch.index_select(layer["table"], 0, bits).view(x.shape))


def _times(layers: list[dict[str, Any]], names: tuple[str, ...], args: Any) -> dict[str, float]:
    """Each configuration's median microseconds a pass; the repeats take the configurations
    in turn, so a drift in the machine's speed reaches all of them alike."""
    for name in names:
        for _ in range(args.calls // 5):
            _pass(layers, name)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            began = time.perf_counter()
            for _ in range(args.calls):
                _pass(layers, name)
            samples[name].append((time.perf_counter() - began) / args.calls * 1e6)
    return {name: statistics.median(found) for name, found in samples.items()}


if __name__ == "__main__":
    main()
