"""Export benchmark: eaglequant against the I/O floor and Quark's own file-to-file flow.

Generates once (cached, seeded) a synthetic BF16 draft of the chosen shape,
sharded at 5 GB, plus a captured-hidden-states folder for calibration; then
measures side by side in one run, each in a fresh subprocess (wall time and
peak RSS of that process tree):

1. the I/O floor: read every input byte into one reused buffer, write the output's byte
   count from another, unbuffered, then fsync (no fresh user-space memory per block);
2. ``eaglequant export --recipe ptpc-fp8`` vs ``ModelQuantizer.direct_quantize_checkpoint``
   on the same input (outputs compared tensor for tensor);
3. ``eaglequant export`` (static recipe) calibrated on the captured tokens, with
   its stage timings, FLOP counts and the GEMM path it took (BF16 or float32);
4. ``eaglequant --help`` and ``eaglequant inspect`` latency;
5. the CPU (model, torch's capability, native BF16 or not) and its GEMM rates
   on a hidden x hidden weight, best of before and after the runs: float32
   ``torch.mm`` (2048 rows), BF16 ``F.linear`` and ``torch.mm`` (256 rows; 8
   where BF16 is not native: a scalar loop), and the export's own
   float32-from-BF16 ``lm_head`` top-1.

``--static-only`` skips the ptpc comparison (2, and Quark's import). The
environment passes to every run, so ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2`` measures a CPU without native BF16 on one with it.

``--runs N`` repeats the measured runs N times: the ptpc comparison's (the I/O floor and
the export each time; Quark's own flow, its import and the tensor-for-tensor check in
the first) and the static export's (the export, then its own I/O floor). ``--before
CHECKOUT`` times another checkout of eaglequant (the previous version, e.g. a ``git
worktree``) beside this one in each run, the two taking turns at going first, with the
same interpreter and venv, its package imported from that checkout, and checks that both
write the same tensors. Each measured run also records how many bytes the disk under the
bench's cache wrote (``disk_written_gb``). Every measured run starts with earlier writes
flushed, none of the bench's files (inputs, kept outputs) in the page cache, and its
memory backed (``settle``).

Results go to ``bench/results-export-<shape>.json`` and a table of ratios on stdout.
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

from eaglequant.results.manifest import read_manifest

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"  # the generated inputs, and every run's scratch and outputs
BACKED_PER_INPUT = 2.5  # memory backed before a run, per input byte: its page cache and RSS
# a child that writes one byte in every page of N bytes, then frees them
TOUCH = "import sys; b = bytearray(int(sys.argv[1])); b[::4096] = b'\\1' * len(b[::4096])"
SHAPES = {
    # hidden, heads, kv_heads, head_dim, intermediate, vocab, draft_vocab
    "kimi-k2.5": dict(
        hidden=7168, heads=64, kv_heads=64, intermediate=12288, vocab=163840, draft_vocab=163840
    ),
    "small": dict(hidden=512, heads=8, kv_heads=8, intermediate=1024, vocab=8192, draft_vocab=8192),
}
EQ = [sys.executable, "-m", "eaglequant.cli"]
HELD_OUT = 8  # the default recipe's held-out sequences, on top of the calibration tokens
MIN_RATE = 0.6  # the static export's arithmetic must run at >= 60% of the reference GEMM rate


def prepare(shape: str, cache: Path, tokens: int) -> tuple[Path, Path]:
    """The synthetic draft and a capture folder, generated once per shape."""
    from eaglequant_examples.synthetic import draft_config, write_random_draft

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
    from eaglequant.io.checkpoint import read_checkpoint
    from eaglequant.rules.draft import dims_from_config

    dims = dims_from_config(read_checkpoint(draft).config)
    seq = 256
    rows = max(1, tokens // seq) + HELD_OUT
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, dims.vocab, (rows, seq), generator=generator)
    aux = torch.randn(rows, seq, dims.fc_in, generator=generator)
    capture.mkdir(parents=True, exist_ok=True)
    save_capture(capture, CalibrationData(ids, aux, "synthetic"), {"synthetic": True})


def stage_sums(stages: dict[str, float], wall: float) -> str:
    """The export's own stages (plain names) against its total and the measured wall time."""
    serial = sum(v for k, v in stages.items() if "." not in k and k != "total")
    total = stages.get("total", serial)
    return (
        f"stages sum {serial:.1f}s, total {total:.1f}s, wall {wall:.1f}s "
        f"({serial / wall:.1%} of wall; rename and exit after the manifest {wall - total:.1f}s)"
    )


def settle(draft: Path | None) -> None:
    """Flush earlier runs' writes, drop every file of the bench's cache from the page cache,
    then have the memory a run on ``draft`` uses backed.

    Every measured run starts the same way: nothing pending to write back, its input on
    disk, not in memory, so "reading" means reading the disk, and no earlier run's output
    held in memory either. On a VM whose host takes back the guest's idle free memory
    (free page reporting), a run that follows idle time pays for faulting each page back
    in: on a 2-core EPYC VM the same floor took 21.5 s after 30 s idle and 7.4 s right after
    a process had touched 14 GiB. So a child first touches :data:`BACKED_PER_INPUT` times
    ``draft``'s size of the free memory, and every run meets memory as a machine of its own
    would.
    """
    os.sync()
    for folder, _, files in os.walk(CACHE):
        for name in files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    if draft is not None:
        wanted = int(BACKED_PER_INPUT * folder_bytes(draft))
        subprocess.run([sys.executable, "-c", TOUCH, str(backed_bytes(wanted))], check=True)


def backed_bytes(wanted: int) -> int:
    """``wanted``, or the available memory less 2 GiB where that is less."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    available = int(info["MemAvailable"].split()[0]) * 1024
    return max(0, min(wanted, available - (2 << 30)))


def timed(
    cmd: list[str], draft: Path | None = None, env: dict[str, str] | None = None
) -> dict[str, float]:
    """Wall time, CPU time (user + system) and peak RSS of one command on ``draft`` and the
    children it waited for (via wait4), started from :func:`settle`'s state.

    ``disk_written_gb``: what the disk under the bench's cache wrote meanwhile
    (with the final fsync's flush; other processes' writes count too).
    """
    settle(draft)
    written = disk_sectors_written()
    started = time.perf_counter()
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{process.stderr.read().decode()[-3000:]}")  # type: ignore[union-attr]
    os.sync()
    result = {
        "wall_s": round(wall, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_rss_gib": round(usage.ru_maxrss / 2**20, 3),
    }
    if written is not None:
        result["disk_written_gb"] = round(((disk_sectors_written() or 0) - written) * 512 / 1e9, 3)
    return result


def disk_sectors_written() -> int | None:
    """Sectors written so far by the block device holding the bench's cache (None: unknown)."""
    device = os.stat(HERE).st_dev
    stat = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat")
    try:
        return int(stat.read_text().split()[6])
    except (OSError, IndexError, ValueError):
        return None


def checkout_env(checkout: Path, scratch: Path) -> dict[str, str]:
    """The environment that imports eaglequant from ``checkout`` instead of this one.

    The package maps ``quantize/``, ``validate/`` and ``configs/`` under its own name
    (pyproject's package-dir), so a tree of links puts them there, as installed.
    ``PYTHONSAFEPATH`` keeps ``python -m`` from putting the working directory first
    on the path: run from this repository, it would import this checkout's package.
    """
    tree = scratch / "before-package" / "eaglequant"
    tree.mkdir(parents=True)
    for entry in (checkout / "eaglequant").iterdir():
        if entry.name != "__pycache__":
            (tree / entry.name).symlink_to(entry.resolve())
    for name in ("quantize", "validate", "configs"):
        if not (tree / name).exists():
            (tree / name).symlink_to((checkout / name).resolve())
    paths = [str(tree.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONSAFEPATH": "1"}


def io_floor(draft: Path, out_bytes: int, scratch: Path) -> dict[str, float]:
    script = (
        "import sys, pathlib\n"
        "src, dst, n = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])\n"
        "buffer = bytearray(1 << 26)\n"
        "for p in sorted(src.glob('*.safetensors')):\n"
        "    with p.open('rb', buffering=0) as f:\n"
        "        while f.readinto(buffer): pass\n"
        "block = memoryview(bytes(1 << 26))\n"
        "with dst.open('wb', buffering=0) as f:\n"
        "    while n > 0:\n"
        "        n -= f.write(block[: min(n, len(block))])\n"
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


def run(
    shape: str,
    tokens: int,
    static: bool = True,
    ptpc: bool = True,
    runs: int = 1,
    before: Path | None = None,
) -> dict[str, Any]:
    draft, capture = prepare_in_child(shape, CACHE, tokens)
    results: dict[str, Any] = {
        "shape": shape,
        "input_bytes": folder_bytes(draft),
        "cpus": os.cpu_count(),
        "cpu": cpu_in_child(SHAPES[shape]["hidden"]),
        "cache": (
            "earlier writes flushed, the bench's files (input, kept outputs) evicted from"
            " the page cache and free memory touched before each run"
        ),
    }
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        scratch = Path(tmp)
        results["help"] = timed([*EQ, "--help"])
        results["inspect"] = timed([*EQ, "inspect", str(draft), "--json"], draft)
        env = checkout_env(before, scratch) if before is not None else None
        if ptpc:
            results.update(ptpc_export(draft, scratch, runs, env))
        if static:
            measured = static_runs(draft, capture, tokens, scratch, runs, env)
            if "io_floor" in results:  # the ptpc comparison's first floor stays the top one
                measured.pop("io_floor")
            results.update(measured)
        out_bytes = results.get("output_bytes") or results["static_output_bytes"]
        if "io_floor" not in results:
            results["io_floor"] = io_floor(draft, out_bytes, scratch)
    best_rates(results["cpu"], cpu_in_child(SHAPES[shape]["hidden"]))
    return results


def best_rates(cpu: dict[str, Any], again: dict[str, Any]) -> None:
    """Keep each GEMM's best of the rates measured before and after the runs.

    Another process on the same cores halves a measurement; the machine's rate is the best.
    """
    cpu["gemm_gflops_runs"] = [cpu["gemm_gflops"], again["gemm_gflops"]]
    cpu["gemm_gflops"] = {
        k: max(r[k] for r in cpu["gemm_gflops_runs"]) for k in again["gemm_gflops"]
    }


def ptpc_export(
    draft: Path, scratch: Path, runs: int = 1, before: dict[str, str] | None = None
) -> dict[str, Any]:
    """``export --recipe ptpc-fp8`` against the I/O floor, ``runs`` times (each run: the
    export and the previous version's with ``before``'s environment, taking turns at going
    first, then the floor), Quark's own flow and Quark's import alone. The top-level
    figures are the first run's."""
    results: dict[str, Any] = {"quark_import": quark_import(), "ptpc_runs": []}
    ptpc, quark, older = scratch / "ptpc", scratch / "quark", scratch / "ptpc-before"
    sides = {"": ([*EQ, "export", str(draft), str(ptpc), "--recipe", "ptpc-fp8"], None, ptpc)}
    if before is not None:
        old_command = [*EQ, "export", str(draft), str(older), "--recipe", "ptpc-fp8"]
        sides["_before"] = (old_command, before, older)
    for index in range(runs):
        one: dict[str, Any] = {}
        for suffix in sorted(sides, reverse=index % 2 == 1):
            command, env, out = sides[suffix]
            one[f"ptpc_export{suffix}"] = timed(command, draft, env=env)
            one[f"ptpc_stages_s{suffix}"] = read_manifest(out)["timings_s"]
        if index == 0:
            results["quark_f2f"] = quark_f2f(draft, quark)
            results["ptpc_equals_quark"] = same_quantized_tensors(ptpc, quark)
            results["output_bytes"] = folder_bytes(ptpc)
            shutil.rmtree(quark)
            if before is not None:
                results["ptpc_equals_before"] = same_quantized_tensors(ptpc, older)
        for _, _, out in sides.values():
            shutil.rmtree(out)
        one["io_floor"] = io_floor(draft, results["output_bytes"], scratch)
        results["ptpc_runs"].append(one)
    results.update(results["ptpc_runs"][0])
    return results


def cpu_in_child(hidden: int) -> dict[str, Any]:
    """:func:`describe_cpu` in a child process (the parent stays small and torch-free)."""
    script = (
        "import sys, json; sys.path.insert(0, sys.argv[1])\n"
        "from export_bench import describe_cpu\n"
        "print(json.dumps(describe_cpu(int(sys.argv[2]))))\n"
    )
    command = [sys.executable, "-c", script, str(HERE), str(hidden)]
    return json.loads(subprocess.run(command, check=True, capture_output=True).stdout)


def describe_cpu(hidden: int) -> dict[str, Any]:
    """The CPU, what torch makes of it, and its GEMM rates (GFLOP/s, best of 3) at ``hidden``."""
    import torch

    from eaglequant.model import compute
    from eaglequant.results.environment import cpu_info

    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return {
        "model": cpu_info()["model"],
        "capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16": native,
        "threads": torch.get_num_threads(),
        "emulation": {k: os.environ[k] for k in EMULATION_ENV if k in os.environ},
        "gemm_path": compute.cpu_gemm_path(),
        "gemm_gflops": gemm_rates(hidden, bf16_mm_rows=256 if native else 8),
    }


EMULATION_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "EAGLEQUANT_GEMM")


def gemm_rates(hidden: int, bf16_mm_rows: int) -> dict[str, float]:
    """GFLOP/s of the issue's GEMMs on a ``hidden`` x ``hidden`` weight, and the export's own.

    ``float32_from_bf16_top1``: :func:`compute.top1` forced to float32 on 512 tokens
    (what calibration scores a micro-batch with), weight blocks upcast included.
    BF16 ``torch.mm`` without native BF16 is a scalar loop: a few rows give its rate.
    """
    import time

    import torch
    import torch.nn.functional as F

    from eaglequant.model import compute

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(hidden, hidden, generator=generator) / hidden**0.5
    bf16 = weight.bfloat16()

    def rate(rows: int, run: Any) -> float:
        x = torch.randn(rows, hidden, generator=generator)
        xb = x.bfloat16()
        best = float("inf")
        for _ in range(4):  # the first run warms up
            started = time.perf_counter()
            run(x, xb)
            best = min(best, time.perf_counter() - started)
        return round(2 * rows * hidden * hidden / best / 1e9, 2)

    os.environ[compute.GEMM_ENV] = "float32"
    return {
        "float32_mm_2048_rows": rate(2048, lambda x, xb: torch.mm(x, weight)),
        "bf16_linear_256_rows": rate(256, lambda x, xb: F.linear(xb, bf16)),
        f"bf16_mm_{bf16_mm_rows}_rows": rate(bf16_mm_rows, lambda x, xb: torch.mm(xb, bf16)),
        "float32_from_bf16_top1_512_rows": rate(512, lambda x, xb: compute.top1(x, bf16)),
    }


def static_runs(
    draft: Path,
    capture: Path,
    tokens: int,
    scratch: Path,
    runs: int = 1,
    before: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The static export ``runs`` times, each run: it and the previous version's (``before``'s
    environment), taking turns at going first, then the I/O floor. The top-level figures
    are the first run's; ``static_runs`` holds every run."""
    sides: dict[str, dict[str, str] | None] = {"": None}
    if before is not None:
        sides["_before"] = before
    measured = []
    for index in range(runs):
        one: dict[str, Any] = {"order": sorted(sides, reverse=index % 2 == 1)}
        for suffix in one["order"]:
            result = static_export(draft, capture, tokens, scratch / "static", sides[suffix])
            one.update({f"{key}{suffix}": value for key, value in result.items()})
        one["io_floor"] = io_floor(draft, one["static_output_bytes"], scratch)
        measured.append(one)
    return {**measured[0], "static_runs": measured}


def static_export(
    draft: Path, capture: Path, tokens: int, out: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """The default recipe calibrated on ``tokens`` captured tokens, with its FLOP counts
    (``env``: the environment of the export's process)."""
    from eaglequant.io.checkpoint import read_checkpoint
    from eaglequant.rules.draft import dims_from_config

    samples = max(1, tokens // 256)
    command = [*EQ, "export", str(draft), str(out), "--calib-hidden-states", str(capture)]
    result = timed([*command, "--calib-samples", str(samples)], draft, env=env)
    manifest = read_manifest(out)
    output_bytes = folder_bytes(out)
    shutil.rmtree(out)
    dims = dims_from_config(read_checkpoint(draft).config)
    calib = manifest["calibration"]
    # the capture named relative to the checkout: results hold no path of this machine
    calib["source"] = calib["source"].replace(str(capture), os.path.relpath(capture, HERE.parent))
    seq, steps = 256, calib["speculative_steps"]
    return {
        "static_export": result,
        "static_output_bytes": output_bytes,
        "static_device": manifest["device"],
        "static_stages_s": manifest["timings_s"],
        "static_calibration": calib,
        "static_layers": manifest["layers"],
        "static_top1_agreement": manifest["top1_agreement_by_step"],
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
    rows = [("I/O floor", results["io_floor"])]
    if "ptpc_export" in results:
        rows.append(("export ptpc-fp8", results["ptpc_export"]))
        rows.append(("Quark direct_quantize_checkpoint", results["quark_f2f"]))
        rows.append(("(import quark.torch alone)", results["quark_import"]))
    if "static_export" in results:
        rows.append(("export fp8-static (calibrated)", results["static_export"]))
    out_bytes = results.get("output_bytes") or results["static_output_bytes"]
    gigabytes = results["input_bytes"] / 1e9, out_bytes / 1e9
    print(f"shape {results['shape']}: input {gigabytes[0]:.2f} GB, output {gigabytes[1]:.2f} GB")
    cpu = results["cpu"]
    print(
        f"CPU {cpu['model']} x{cpu['threads']} threads, torch capability {cpu['capability']}, "
        f"native BF16 {cpu['native_bf16']}, emulation {cpu['emulation'] or 'none'}"
    )
    print(f"GEMM rates GFLOP/s ({results['cpu']['gemm_path']} path chosen): {cpu['gemm_gflops']}")
    print(f"{'run':36} {'x floor':>8} {'wall s':>8} {'CPU s':>8} {'peak RSS GiB':>13}")
    for name, row in rows:
        ratio, cpu_s = row["wall_s"] / floor, row.get("cpu_s", float("nan"))
        print(
            f"{name:36} {ratio:8.2f} {row['wall_s']:8.2f} {cpu_s:8.2f} {row['peak_rss_gib']:13.2f}"
        )
    if "ptpc_export" in results:
        print(f"ptpc output equals Quark's tensor for tensor: {results['ptpc_equals_quark']}")
        if "ptpc_equals_before" in results:
            print(f"ptpc output equals the previous version's: {results['ptpc_equals_before']}")
        for index, one in enumerate(results.get("ptpc_runs", [results])):
            print_ptpc_run(index + 1, one, results["cpus"])
    if "static_stages_s" in results:
        print_static(results, floor)
        for index, one in enumerate(results.get("static_runs", [])):
            print_static_run(index + 1, one)
    print(f"--help {results['help']['wall_s']:.3f}s, inspect {results['inspect']['wall_s']:.3f}s")


def print_ptpc_run(number: int, one: dict, cpus: int) -> None:  # type: ignore[type-arg]
    """One measured run: the floor, this version and the previous one, each stage.

    A run's CPU time over the cores it could use is the least wall time it could take.
    """
    floor = one["io_floor"]["wall_s"]
    print(f"ptpc run {number}: I/O floor {floor:.2f}s")
    for label, suffix in (("this version", ""), ("previous version", "_before")):
        if f"ptpc_export{suffix}" not in one:
            continue
        row, stages = one[f"ptpc_export{suffix}"], one[f"ptpc_stages_s{suffix}"]
        print(
            f"  {label}: {row['wall_s']:.2f}s = {row['wall_s'] / floor:.2f}x floor, peak RSS "
            f"{row['peak_rss_gib']:.2f} GiB, disk wrote {row.get('disk_written_gb', '?')} GB"
        )
        if "cpu_s" in row:
            least = row["cpu_s"] / cpus
            print(
                f"    CPU {row['cpu_s']:.1f}s on {cpus} cores: no less than {least:.1f}s "
                f"= {least / floor:.2f}x floor however well it overlaps"
            )
        print(f"    stages: {stages}")
        print(f"    {stage_sums(stages, row['wall_s'])}")


def print_static_run(number: int, one: dict) -> None:  # type: ignore[type-arg]
    """One static run: each version's wall time and what is left of it besides Quark's
    calibration passes and the held-out measurement, against this run's floor."""
    floor = one["io_floor"]["wall_s"]
    labels = {"": "this version", "_before": "previous version"}
    print(f"static run {number}: I/O floor {floor:.2f}s, {labels[one['order'][0]]} first")
    for suffix in sorted(one["order"]):
        wall, stages = one[f"static_export{suffix}"]["wall_s"], one[f"static_stages_s{suffix}"]
        calibration, measurement = stages["quantize.quark_calibration"], stages["measure"]
        rest = wall - calibration - measurement
        print(
            f"  {labels[suffix]}: {wall:.1f}s; calibration {calibration:.1f}s, measurement "
            f"{measurement:.1f}s, the rest {rest:.1f}s = {rest / floor:.2f}x floor"
        )


def reference_rate(cpu: dict) -> float:  # type: ignore[type-arg]
    """GFLOP/s the export's arithmetic is held to: float32, or native BF16 if faster."""
    rates = cpu["gemm_gflops"]
    native = rates["bf16_linear_256_rows"] if cpu["native_bf16"] else 0.0
    return float(max(rates["float32_mm_2048_rows"], native))


def print_static(results: dict, floor: float) -> None:  # type: ignore[type-arg]
    stages, flop = results["static_stages_s"], results["static_flop"]
    calib_s, measure_s = stages["quantize.quark_calibration"], stages["measure"]
    rate = reference_rate(results["cpu"])
    print(f"static export stages: {stages}")
    print(f"static export GEMM path: {results['static_device'].get('gemm')}")
    for name, seconds in (("calibration", calib_s), ("held-out measurement", measure_s)):
        work = flop[name.split()[-1]]
        achieved = work / seconds / 1e9
        print(
            f"{name}: {work / 1e12:.1f} TFLOP in {seconds:.1f}s = {achieved:.0f} GFLOP/s, "
            f"{achieved / rate:.0%} of the reference GEMM rate {rate:.0f} GFLOP/s"
        )
    arithmetic = (flop["calibration"] + flop["measurement"]) / rate / 1e9
    wall = results["static_export"]["wall_s"]
    print(
        f"static target 3 x floor + arithmetic at {MIN_RATE:.0%} of the reference rate = "
        f"{3 * floor + arithmetic / MIN_RATE:.1f}s (at the full rate "
        f"{3 * floor + arithmetic:.1f}s); measured {wall:.1f}s; peak RSS "
        f"{results['static_export']['peak_rss_gib'] * 2**30 / results['input_bytes']:.2f}x input"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--tokens", type=int, default=4096, help="calibration tokens")
    parser.add_argument("--skip-static", action="store_true", help="only the ptpc comparison")
    parser.add_argument("--static-only", action="store_true", help="no ptpc comparison")
    parser.add_argument(
        "--results", type=Path, help="JSON file (default bench/results-export-SHAPE.json)"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="measured runs of each comparison (default 1)"
    )
    parser.add_argument(
        "--before", type=Path, help="another checkout (the previous version) timed beside this one"
    )
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    results = run(
        args.shape,
        args.tokens,
        static=not args.skip_static,
        ptpc=not args.static_only,
        runs=args.runs,
        before=args.before,
    )
    path = args.results or HERE / f"results-export-{args.shape}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


if __name__ == "__main__":
    main()
