"""What an engine process reports about itself: its exact configuration, kernels and memory.

Runs inside engine children (validate's, capture's), after vLLM is imported there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eaglequant.engine.config import serve_line
from eaglequant.results.engine_result import EngineRecord

ENV_PREFIXES = ("VLLM_", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def engine_record(kwargs: Mapping[str, Any]) -> EngineRecord:
    """The ``vllm.LLM`` arguments, the vLLM environment, vLLM's version and the serve line."""
    # lazy: vllm is an optional extra
    import vllm

    return {
        "llm": dict(kwargs),
        "env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)},
        "vllm": str(getattr(vllm, "__version__", "unknown")),
        "serve_line": serve_line(kwargs),
    }


def loaded_kernel_libraries() -> list[str]:
    """vLLM's compiled extension files this process has mapped (which CPU ISA build, e.g.)."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8")
    except OSError:
        return []
    names = {line.rsplit("/", 1)[-1] for line in maps.splitlines() if "/vllm/_" in line}
    return sorted(n for n in names if n.endswith(".so"))


def tree_peak_rss_mib(pid: int | None = None) -> float | None:
    """Sum of the peak resident sizes (VmHWM) of a process and its live descendants (Linux)."""
    root = pid or os.getpid()
    try:
        parents = {int(p.name): _ppid(p) for p in Path("/proc").iterdir() if p.name.isdigit()}
    except OSError:
        return None
    tree, grew = {root}, True
    while grew:
        found = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= found
        grew = bool(found)
    return round(sum(_peak_kib(p) for p in tree) / 1024, 1)


def _ppid(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _peak_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0
