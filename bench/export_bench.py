"""Export benchmark: eaglequant against the I/O floor and Quark's own file-to-file flow.

Generates once (cached, seeded) a synthetic BF16 draft of the chosen shape,
sharded at 5 GB, plus a captured-hidden-states folder for calibration; then
measures side by side in one run, each in a fresh subprocess (wall time and
peak RSS of that process tree):

1. the I/O floor: read every input byte, write the output's byte count;
2. ``eaglequant export --recipe ptpc-fp8`` vs ``ModelQuantizer.direct_quantize_checkpoint``
   on the same input (outputs compared tensor for tensor);
3. ``eaglequant export`` (static recipe) calibrated on the captured tokens, with
   its stage timings;
4. ``eaglequant --help`` and ``eaglequant inspect`` latency.

Results go to ``bench/results-<shape>.json`` and a table of ratios on stdout.
``--shape small`` is the CI smoke variant (not timed there).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eaglequant.manifest import read_manifest

HERE = Path(__file__).resolve().parent
SHAPES = {
    # hidden, heads, kv_heads, head_dim, intermediate, vocab, draft_vocab
    "kimi-k2.5": dict(
        hidden=7168, heads=64, kv_heads=64, intermediate=12288, vocab=163840, draft_vocab=163840
    ),
    "small": dict(hidden=512, heads=8, kv_heads=8, intermediate=1024, vocab=8192, draft_vocab=8192),
}
EQ = [sys.executable, "-m", "eaglequant.cli"]
HELD_OUT = 8  # the default recipe's held-out sequences, on top of the calibration tokens


def prepare(shape: str, cache: Path, tokens: int) -> tuple[Path, Path]:
    """The synthetic draft and a capture folder, generated once per shape."""
    from eaglequant.devtools.synthetic import draft_config, write_random_draft

    draft, capture = cache / shape / "draft", cache / shape / f"capture-{tokens}"
    if not (draft / "config.json").exists():
        dims = SHAPES[shape]
        config = draft_config(aux_layer_ids=(2, 30, 58), **dims)
        config["head_dim"] = 128 if shape == "kimi-k2.5" else dims["hidden"] // dims["heads"]
        shutil.rmtree(draft, ignore_errors=True)
        write_random_draft(draft, config, seed=0, max_shard_size=5 * 10**9)
    if not (capture / "capture.json").exists():
        write_capture(draft, capture, tokens)
    return draft, capture


def write_capture(draft: Path, capture: Path, tokens: int) -> None:
    import torch

    from eaglequant.capture.store import CalibrationData, save_capture
    from eaglequant.draft import dims_from_config
    from eaglequant.io.checkpoint import read_checkpoint

    dims = dims_from_config(read_checkpoint(draft).config)
    seq = 256
    rows = max(1, tokens // seq) + HELD_OUT
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, dims.vocab, (rows, seq), generator=generator)
    aux = torch.randn(rows, seq, dims.fc_in, generator=generator)
    capture.mkdir(parents=True, exist_ok=True)
    save_capture(capture, CalibrationData(ids, aux, "synthetic"), {"synthetic": True})


def machine() -> dict[str, str]:
    """The CPU model and the instruction set torch dispatches to (``ATEN_CPU_CAPABILITY``)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    cpu = f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model "
    cpu += f"{fields.get('model', '?')})"
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    capability = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    return {"cpu": cpu, "cpu_capability": capability}


def stage_sums(stages: dict[str, float], wall: float) -> str:
    """The export's own stages (plain names) against its total and the measured wall time."""
    serial = sum(v for k, v in stages.items() if "." not in k and k != "total")
    total = stages.get("total", serial)
    return (
        f"stages sum {serial:.1f}s, total {total:.1f}s, wall {wall:.1f}s "
        f"({serial / wall:.1%} of wall; rename and exit after the manifest {wall - total:.1f}s)"
    )


def settle(*folders: Path) -> None:
    """Flush earlier runs' writes, then drop ``folders``' files from the page cache.

    Every measured run starts the same way: nothing pending to write back and
    its input on disk, not in memory, so "reading" means reading the disk.
    """
    os.sync()
    for folder in folders:
        for path in folder.iterdir():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(cmd: list[str], *cold: Path) -> dict[str, float]:
    """Wall time and peak RSS (of the child, via wait4) of one command, ``cold`` folders evicted."""
    settle(*cold)
    started = time.perf_counter()
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{process.stderr.read().decode()[-3000:]}")  # type: ignore[union-attr]
    return {"wall_s": round(wall, 3), "peak_rss_gib": round(usage.ru_maxrss / 2**20, 3)}


def io_floor(draft: Path, out_bytes: int, scratch: Path) -> dict[str, float]:
    script = (
        "import sys, pathlib\n"
        "src, dst, n = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])\n"
        "for p in sorted(src.glob('*.safetensors')):\n"
        "    with p.open('rb') as f:\n"
        "        while f.read(1 << 26): pass\n"
        "block = b'\\0' * (1 << 26)\n"
        "with dst.open('wb') as f:\n"
        "    while n > 0:\n"
        "        f.write(block[: min(n, len(block))]); n -= len(block)\n"
        "    f.flush(); import os; os.fsync(f.fileno())\n"
    )
    command = [sys.executable, "-c", script, str(draft), str(scratch / "floor.bin"), str(out_bytes)]
    result = timed(command, draft)
    (scratch / "floor.bin").unlink()
    return result


def quark_f2f(draft: Path, out: Path) -> dict[str, float]:
    script = (
        "import sys\n"
        "from eaglequant.quantize.quark_backend import quark_config, quiet_quark\n"
        "from eaglequant.recipe import load_recipe\n"
        "quiet_quark()\n"
        "from quark.torch import ModelQuantizer\n"
        "ModelQuantizer(quark_config(load_recipe('ptpc-fp8'))).direct_quantize_checkpoint("
        "sys.argv[1], sys.argv[2], device='cpu')\n"
    )
    return timed([sys.executable, "-c", script, str(draft), str(out)], draft)


def quark_import() -> dict[str, float]:
    """The fixed cost every Quark flow pays before touching a byte: ``import quark.torch``."""
    script = (
        "from eaglequant.quantize.quark_backend import quiet_quark\n"
        "quiet_quark()\n"
        "import quark.torch\n"
    )
    return timed([sys.executable, "-c", script])


def same_quantized_tensors(mine: Path, theirs: Path) -> bool:
    from eaglequant.io.checkpoint import read_checkpoint

    a, b = read_checkpoint(mine), read_checkpoint(theirs)
    return set(a.tensors) == set(b.tensors) and all(
        a.tensors[n].same_bytes(b.tensors[n]) for n in a.tensors
    )


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def prepare_in_child(shape: str, cache: Path, tokens: int) -> tuple[Path, Path]:
    """Generate in a child process: a forked child's peak RSS starts at its parent's, so
    the parent must stay small for the wait4 figures of the measured runs to be right."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from export_bench import prepare\n"
        "from pathlib import Path\n"
        "prepare(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(HERE), shape, str(cache), str(tokens)], check=True
    )
    return cache / shape / "draft", cache / shape / f"capture-{tokens}"


def run(shape: str, tokens: int, static: bool = True) -> dict[str, Any]:
    cache = HERE / ".cache"
    draft, capture = prepare_in_child(shape, cache, tokens)
    results: dict[str, Any] = {
        "shape": shape,
        "input_bytes": folder_bytes(draft),
        "cpus": os.cpu_count(),
        **machine(),
        "cache": "input evicted from the page cache and earlier writes flushed before each run",
    }
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        scratch = Path(tmp)
        results["help"] = timed([*EQ, "--help"])
        results["inspect"] = timed([*EQ, "inspect", str(draft), "--json"], draft)
        results["quark_import"] = quark_import()
        ptpc, quark = scratch / "ptpc", scratch / "quark"
        command = [*EQ, "export", str(draft), str(ptpc), "--recipe", "ptpc-fp8"]
        results["ptpc_export"] = timed(command, draft)
        results["quark_f2f"] = quark_f2f(draft, quark)
        results["ptpc_stages_s"] = read_manifest(ptpc)["timings_s"]
        results["ptpc_equals_quark"] = same_quantized_tensors(ptpc, quark)
        results["output_bytes"] = out_bytes = folder_bytes(ptpc)
        shutil.rmtree(quark)
        shutil.rmtree(ptpc)
        results["io_floor"] = io_floor(draft, out_bytes, scratch)
        if static:
            results.update(static_export(draft, capture, tokens, scratch / "static"))
    return results


def static_export(draft: Path, capture: Path, tokens: int, out: Path) -> dict[str, Any]:
    """The default recipe calibrated on ``tokens`` captured tokens, with its FLOP counts."""
    from eaglequant.draft import dims_from_config
    from eaglequant.io.checkpoint import read_checkpoint

    samples = max(1, tokens // 256)
    command = [*EQ, "export", str(draft), str(out), "--calib-hidden-states", str(capture)]
    result = timed([*command, "--calib-samples", str(samples)], draft, capture)
    manifest = read_manifest(out)
    shutil.rmtree(out)
    dims = dims_from_config(read_checkpoint(draft).config)
    calib = manifest["calibration"]
    seq, steps = 256, calib["speculative_steps"]
    return {
        "static_export": result,
        "static_stages_s": manifest["timings_s"],
        "static_calibration": calib,
        "static_flop": {
            "calibration": draft_flop(dims, calib["tokens"], seq, steps, scored_steps=steps - 1),
            "measurement": 2 * draft_flop(dims, calib["held_out_tokens"], seq, steps, steps)
            + calib["held_out_tokens"] * steps * 2 * midlayer_params(dims),
        },
    }


def midlayer_params(dims: Any) -> int:
    h, q, kv = dims.hidden, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    return 2 * h * (q + 2 * kv) + q * h + 3 * h * dims.intermediate


def draft_flop(dims: Any, tokens: int, seq: int, steps: int, scored_steps: int) -> int:
    """Multiply-adds x 2 of unrolling the draft ``steps`` steps over ``tokens`` tokens.

    fc once; per step the midlayer linears and attention over the step-0 keys plus
    one key per earlier step (computed densely, as SDPA with a mask does); lm_head
    on ``scored_steps`` steps. Norms, RoPE and activations are left out (< 1%).
    """
    attention = sum(4 * dims.heads * dims.head_dim * seq * k for k in range(1, steps + 1))
    per_token = (
        2 * dims.fc_in * dims.hidden
        + steps * 2 * midlayer_params(dims)
        + scored_steps * 2 * dims.hidden * dims.draft_vocab
    )
    return tokens * per_token + (tokens // seq) * seq * attention


def print_table(results: dict) -> None:  # type: ignore[type-arg]
    floor = results["io_floor"]["wall_s"]
    rows = [
        ("I/O floor", results["io_floor"]),
        ("export ptpc-fp8", results["ptpc_export"]),
        ("Quark direct_quantize_checkpoint", results["quark_f2f"]),
        ("(import quark.torch alone)", results["quark_import"]),
    ]
    if "static_export" in results:
        rows.append(("export fp8-static (calibrated)", results["static_export"]))
    gigabytes = results["input_bytes"] / 1e9, results["output_bytes"] / 1e9
    print(f"shape {results['shape']}: input {gigabytes[0]:.2f} GB, output {gigabytes[1]:.2f} GB")
    print(f"{results.get('cpu')}, {results['cpus']} cores, torch {results.get('cpu_capability')}")
    print(f"{'run':36} {'x floor':>8} {'wall s':>8} {'peak RSS GiB':>13}")
    for name, row in rows:
        ratio = row["wall_s"] / floor
        print(f"{name:36} {ratio:8.2f} {row['wall_s']:8.2f} {row['peak_rss_gib']:13.2f}")
    print(f"ptpc output equals Quark's tensor for tensor: {results['ptpc_equals_quark']}")
    print(f"ptpc export stages: {results['ptpc_stages_s']}")
    print(f"ptpc {stage_sums(results['ptpc_stages_s'], results['ptpc_export']['wall_s'])}")
    if "static_stages_s" in results:
        print_static(results, floor)
    print(f"--help {results['help']['wall_s']:.3f}s, inspect {results['inspect']['wall_s']:.3f}s")


def print_static(results: dict, floor: float) -> None:  # type: ignore[type-arg]
    stages, flop = results["static_stages_s"], results["static_flop"]
    calib_s, measure_s = stages["quantize.quark_calibration"], stages["measure"]
    print(f"static export stages: {stages}")
    print(
        f"calibration arithmetic: {flop['calibration'] / 1e12:.1f} TFLOP in {calib_s:.1f}s "
        f"= {flop['calibration'] / calib_s / 1e9:.0f} GFLOP/s; held-out measurement "
        f"{flop['measurement'] / 1e12:.1f} TFLOP in {measure_s:.1f}s "
        f"= {flop['measurement'] / measure_s / 1e9:.0f} GFLOP/s"
    )
    budget = 3 * floor + calib_s
    wall = results["static_export"]["wall_s"]
    print(
        f"static target 3 x floor + calibration = {budget:.1f}s; measured {wall:.1f}s, "
        f"{wall - measure_s:.1f}s without the held-out measurement"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--tokens", type=int, default=4096, help="calibration tokens")
    parser.add_argument("--skip-static", action="store_true", help="only the ptpc comparison")
    parser.add_argument("--results", type=Path, help="JSON file (default bench/results-SHAPE.json)")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    results = run(args.shape, args.tokens, static=not args.skip_static)
    path = args.results or HERE / f"results-{args.shape}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


if __name__ == "__main__":
    main()
