"""How fast the CPU runs before each server: the drift that rounds inside a server cannot see.

Served on a CPU, vLLM's throughput follows the host's speed, and a shared or virtual
machine's speed can move by 2x within minutes and stay there for whole servers (on the
2-core test machine a BF16 GEMM ran at 603, 1,531 and 660 GFLOP/s within three hours,
docs/release-table.md). ``tune`` compares servers with one another, but takes its noise
from the rounds inside each server, so such a move reads as a difference between
configurations. After each server has stopped (nothing else of the sweep running), tune
times one core's float32 GEMM in a child process and reports how far that speed moved
across the run's servers; a fraction of a second each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping

import numpy as np

SIZE, REPEATS = 512, 25
PROBE = f"one core's float32 GEMM {SIZE} x {SIZE} x {SIZE} (numpy), the fastest of {REPEATS}"
# One BLAS thread: two threads on two busy-or-not vCPUs measured 200 and 290 GFLOP/s a second
# apart on an idle machine; one thread stayed within 5%.
ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
CHILD = "from eaglequant.tune.machine import gemm_gflops; print(gemm_gflops())"


def cpu_gflops(timeout: float = 120) -> float | None:
    """One core's GFLOP/s (:func:`gemm_gflops` in a child process, its BLAS on one thread);
    None where the probe failed (it is a diagnostic: the sweep goes on without it)."""
    env = dict(os.environ, **ONE_THREAD)
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        return float(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return None


def gemm_gflops(size: int = SIZE, repeats: int = REPEATS) -> float:
    """GFLOP/s of the fastest of ``repeats`` float32 ``size``-cubed GEMMs, after one unmeasured."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    np.matmul(a, b)  # the BLAS thread pool starts here, not inside a measurement
    fastest = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.matmul(a, b)
        fastest = min(fastest, time.perf_counter() - started)
    return 2 * size**3 / fastest / 1e9


def speed_spread(gflops: Mapping[str, float]) -> float:
    """How far the speed moved across servers: (fastest - slowest) / fastest."""
    fastest = max(gflops.values())
    return (fastest - min(gflops.values())) / fastest if fastest > 0 else 0.0
