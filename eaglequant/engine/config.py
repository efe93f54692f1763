"""How the tool configures vLLM: parallelism, the user's engine arguments, platform defaults.

One home for what validate, tune (and capture) hand to vLLM, so the three run
the engine the same way and report exactly how it ran:

- ``EngineOptions``: the target's ``tensor_parallel_size`` and any other
  ``vllm.EngineArgs`` field the user passes (``--engine-arg KEY=VALUE``),
  checked against vLLM's own ``EngineArgs`` before any engine starts;
- ``platform_defaults``: what only the CPU platform needs (``enforce_eager``,
  ``VLLM_CPU_KVCACHE_SPACE``, a short ``max_model_len``, one core range per
  worker in ``VLLM_CPU_OMP_THREADS_BIND``); on GPU/ROCm vLLM's own defaults
  (graph capture included) stay unless the user asks otherwise;
- ``serve_line``: the equivalent ``vllm serve`` command for a report.

Nothing here imports vLLM: ``probe_vllm`` asks a child process for the
platform and the ``EngineArgs`` fields.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import os
import shlex
import subprocess
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from eaglequant.engine.vllm_internals import W8A16_KERNELS, gate, version_warning
from eaglequant.errors import InputError
from eaglequant.rules.speculative import SpeculativeDict

CPU_KVCACHE_SPACE_GIB = "1"
CPU_MAX_MODEL_LEN = 1024
DISABLED_KERNELS = "VLLM_DISABLED_KERNELS"  # vLLM's own switch for kernels it must not pick
# Set by the tool itself from its own options or inputs; the message names what to use instead.
RESERVED_ARGS = {
    "model": "the target folder",
    "tokenizer": "the target folder",
    "speculative_config": "the draft and k",
    "tensor_parallel_size": "the tensor parallel size option",
    "max_model_len": "the max model length option",
    "worker_extension_cls": "nothing: the tool inspects the draft through it",
    "kv_transfer_config": "nothing: capture sets it to save hidden states",
}


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """The target's parallelism and extra ``EngineArgs`` fields, as the user gave them."""

    tensor_parallel_size: int = 1
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    max_model_len: int | None = None


def parse_engine_arg(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (``key``, value); the value is JSON where it parses, else a string."""
    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise InputError(f"engine argument {text!r}: write it as KEY=VALUE, e.g. max_num_seqs=8")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def check_engine_args(
    args: Mapping[str, Any], known: Collection[str], reserved: Mapping[str, str] = RESERVED_ARGS
) -> None:
    """Refuse keys vLLM's ``EngineArgs`` (``known``) lacks, or that the tool sets itself."""
    for key in args:
        if key in reserved:
            raise InputError(
                f"engine argument {key!r} is set by eaglequant; use {reserved[key]} instead"
            )
    unknown = sorted(set(args) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "see vLLM's EngineArgs for valid keys"
        raise InputError(f"engine argument {unknown[0]!r} is not a vLLM EngineArgs field; {hint}")


@dataclass(frozen=True)
class VllmInstall:
    """What a child process learns of the installed vLLM without starting an engine."""

    device_type: str
    engine_args: frozenset[str]
    device_env: str = ""
    device_count: int = 0
    fp8_kv_cache_refusal: str = ""  # vLLM's reason it cannot run an FP8 KV cache here
    attention_backends: frozenset[str] = frozenset()  # AttentionBackendEnum's names
    version: str = ""
    # Per feature, the vLLM internals it needs that this vLLM lacks (vllm_internals.FEATURES).
    missing_hooks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def gate(self, feature: str) -> str:
        """Empty when ``feature`` is on here; else one line naming what this vLLM lacks."""
        return gate(self.missing_hooks, feature)

    def require(self, command: str, *features: str) -> None:
        """Refuse ``command`` before any engine starts when all of ``features`` are off."""
        lines = [self.gate(f) for f in features]
        if all(lines):
            raise InputError(f"{command} cannot run here: {lines[0]}")

    @property
    def on_cpu(self) -> bool:
        return self.device_type == "cpu"


def check_kv_cache_dtype(kv_cache_dtype: str | None, install: VllmInstall, source: str) -> None:
    """Refuse an FP8 draft KV cache where vLLM cannot run one, with vLLM's reason, before any
    engine starts; ``source`` names what asked for it (an option, a draft, a recipe)."""
    if kv_cache_dtype is None or not kv_cache_dtype.startswith("fp8"):
        return
    if install.fp8_kv_cache_refusal:
        raise InputError(
            f"{source}: a {kv_cache_dtype} draft KV cache, which vLLM cannot run on this machine "
            f'("{install.fp8_kv_cache_refusal}", its CPU attention backend); run it where vLLM '
            "can (a GPU, or a CPU with AVX-512 or AMX), or pass --draft-kv-cache-dtype auto to "
            "keep the target's KV cache dtype"
        )


def check_attention_backend(name: str | None, install: VllmInstall, source: str) -> None:
    """Refuse an attention backend this vLLM does not name, before any engine starts."""
    if name is None or name.upper() in install.attention_backends:
        return
    known = ", ".join(sorted(install.attention_backends))
    raise InputError(f"{source} {name!r}: not one of vLLM's attention backends ({known})")


PROBE = """
import dataclasses, json
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from eaglequant.engine.vllm_internals import cpu_fp8_kv_refusal, gate, missing_by_feature
fields = [f.name for f in dataclasses.fields(EngineArgs)]
cpu = current_platform.is_cpu()
count = 0 if cpu else current_platform.device_count()
device_env = current_platform.device_control_env_var
missing = missing_by_feature()
# vLLM's own test, as its CPU attention backend asks it for a draft's head size
# (unprobed counts as refused)
fp8_kv = (gate(missing, "CPU FP8 KV-cache probe") or cpu_fp8_kv_refusal()) if cpu else ""
backends = [b.name for b in AttentionBackendEnum]
import vllm
version = vllm.__version__
print(json.dumps([current_platform.device_type, fields, device_env, count, fp8_kv, backends,
                  version, missing]))
"""


@functools.cache
def probe_vllm(python: str) -> VllmInstall:
    """vLLM's platform and ``EngineArgs`` fields, asked of a child process (once per run).

    A child, so this process never loads vLLM (nor, through it, a kernel library).
    """
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    done = subprocess.run(
        [python, "-c", PROBE], capture_output=True, text=True, timeout=600, env=env, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise InputError(f"vLLM cannot be imported here ({tail[0]}); install eaglequant[vllm]")
    device_type, fields, device_env, count, fp8_kv, backends, version, missing = json.loads(
        lines[-1]
    )
    install = VllmInstall(
        str(device_type),
        frozenset(fields),
        str(device_env),
        int(count),
        str(fp8_kv),
        frozenset(backends),
        str(version),
        {str(k): tuple(v) for k, v in missing.items()},
    )
    warning = version_warning(install.version)
    if warning:
        logging.getLogger("eaglequant").warning(warning)
    return install


def llm_kwargs(options: EngineOptions, target: str, speculative: SpeculativeDict | None) -> dict:
    """Keyword arguments for ``vllm.LLM``, before platform defaults."""
    kwargs: dict[str, Any] = {
        "model": target,
        "speculative_config": speculative,
        "tensor_parallel_size": options.tensor_parallel_size,
        "seed": 0,
    }
    if options.max_model_len is not None:
        kwargs["max_model_len"] = options.max_model_len
    return kwargs | dict(options.engine_args)


def platform_defaults(kwargs: dict[str, Any], on_cpu: bool) -> dict[str, Any]:
    """``vllm.LLM`` arguments with the CPU platform's defaults; unchanged elsewhere."""
    if not on_cpu:
        return dict(kwargs)
    return {"enforce_eager": True, "max_model_len": CPU_MAX_MODEL_LEN} | kwargs


def platform_env(
    env: Mapping[str, str], on_cpu: bool, workers: int, cores: list[int]
) -> dict[str, str]:
    """Environment variables to add for the CPU platform (none elsewhere, none the user set;
    vLLM's W8A16 AMX FP8 kernels added to the kernels the user switched off, so a static FP8
    draft quantizes its inputs as it does on a GPU)."""
    if not on_cpu:
        return {}
    added = {"VLLM_CPU_KVCACHE_SPACE": CPU_KVCACHE_SPACE_GIB}
    if workers > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in env:
        added["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(cores, workers)
    disabled = [k for k in env.get(DISABLED_KERNELS, "").split(",") if k]
    missing = [kernel for kernel in W8A16_KERNELS if kernel not in disabled]
    if missing:
        added[DISABLED_KERNELS] = ",".join([*disabled, *missing])
    return {k: v for k, v in added.items() if k not in env or k == DISABLED_KERNELS}


def worker_count(kwargs: Mapping[str, Any]) -> int:
    """Worker processes vLLM starts for these arguments (tensor x pipeline parallel)."""
    return int(kwargs.get("tensor_parallel_size") or 1) * int(
        kwargs.get("pipeline_parallel_size") or 1
    )


def device_count(kwargs: Mapping[str, Any]) -> int:
    """Devices one served model uses: tensor x pipeline x data parallel (CPU: workers)."""
    return worker_count(kwargs) * int(kwargs.get("data_parallel_size") or 1)


def cpu_thread_binding(cores: list[int], workers: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND``: the usable cores split into one range per worker."""
    if len(cores) < workers:
        raise InputError(
            f"{workers} CPU workers need at least {workers} cores, this process may use "
            f"{len(cores)}; lower the parallelism or set VLLM_CPU_OMP_THREADS_BIND yourself"
        )
    per = len(cores) // workers
    groups = [cores[i * per : (i + 1) * per] for i in range(workers)]
    return "|".join(",".join(str(c) for c in group) for group in groups)


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def serve_flags(engine_args: Mapping[str, Any]) -> list[str]:
    """Engine arguments as ``vllm serve`` flags (``--max-num-seqs 8``, ``--no-enforce-eager``)."""
    flags: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict | list):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def serve_line(kwargs: Mapping[str, Any]) -> str:
    """The ``vllm serve`` command equivalent to one engine run's ``vllm.LLM`` arguments."""
    rest = {k: v for k, v in kwargs.items() if k not in ("model", "seed") and v is not None}
    if not rest.get("trust_remote_code"):
        rest.pop("trust_remote_code", None)
    return shlex.join(["vllm", "serve", str(kwargs["model"]), *serve_flags(rest)])
