"""Capturing a target's auxiliary hidden states: one path for capture, export and validate.

``CaptureEngine`` says which engine runs the target and how (vLLM with its
parallelism and engine arguments, or transformers in this process);
``check_engine`` checks that choice before anything heavy starts;
``capture_into`` runs it on given token-id sequences and writes a capture folder
(:mod:`eaglequant.capture.store`); ``capture_hidden_states`` is the
``eaglequant capture`` command: checks, tokenizes, and publishes the folder
atomically.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from eaglequant.capture.records import CaptureInfo, CaptureSource, TransformersRun, VllmRun
from eaglequant.capture.sequences import check_data, tokenize_data
from eaglequant.capture.store import (
    CAPTURE_FORMAT,
    CAPTURE_TENSORS,
    CaptureFile,
    target_embeddings,
    write_info,
)
from eaglequant.capture.vllm_engine import capture_vllm
from eaglequant.engine.config import (
    RESERVED_ARGS,
    EngineOptions,
    VllmInstall,
    check_engine_args,
    probe_vllm,
)
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.output import atomic_output_dir, check_output_path
from eaglequant.prompts.source import PromptSource
from eaglequant.rules.draft import require_bf16_draft
from eaglequant.rules.target_fit import (
    check_aux_layers,
    check_target_fits,
    default_aux_layers,
    target_layers,
)

EngineName = Literal["vllm", "transformers"]
# max_model_len is free here (the default fits the longest sequence); the rest as validate's.
CAPTURE_RESERVED: Mapping[str, str] = {
    **{key: use for key, use in RESERVED_ARGS.items() if key != "max_model_len"},
    "enable_chunked_prefill": "nothing: capture turns chunked prefill off, as vLLM requires",
    "data_parallel_size": "the data parallel size option",
}
SCRATCH = ".engine-scratch"


def default_engine() -> EngineName:
    """vLLM where it is installed (the engine the draft is served with), else transformers."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"


@dataclass(frozen=True, kw_only=True)
class CaptureEngine:
    """Which engine runs the target, with what parallelism and arguments (vLLM only)."""

    name: EngineName = "vllm"
    options: EngineOptions = field(default_factory=EngineOptions)
    data_parallel_size: int = 1
    timeout_s: float | None = None
    trust_remote_code: bool = False


def check_engine(engine: CaptureEngine) -> VllmInstall | None:
    """Before any engine starts: vLLM importable, the engine arguments its own."""
    if engine.name == "transformers":
        if engine.options != EngineOptions() or engine.data_parallel_size != 1:
            raise InputError(
                "parallelism and engine arguments apply to the vLLM engine; "
                "use the vllm engine or drop them"
            )
        return None
    install = probe_vllm(sys.executable)
    if install.on_cpu and (line := install.gate("CPU capture connector")):
        raise InputError(f"capture with vLLM on this CPU needs {line}; use the transformers engine")
    check_engine_args(engine.options.engine_args, install.engine_args, CAPTURE_RESERVED)
    return install


def capture_into(
    folder: Path,
    *,
    target: Path,
    sequences: list[list[int]],
    aux_ids: tuple[int, ...],
    engine: CaptureEngine,
    embeddings: bool = False,
    source: CaptureSource | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> CaptureInfo:
    """Run the target on ``sequences``; write the capture into ``folder``; return its info.

    ``source`` (where the sequences came from) is recorded in ``capture.json``.
    """
    config, _layers = target_layers(target)
    install = check_engine(engine)
    embed = target_embeddings(target) if embeddings else None
    width = len(aux_ids) * int(config["hidden_size"])
    file = CaptureFile.create(folder / CAPTURE_TENSORS, sequences, width, embed)
    progress(f"capturing {len(sequences)} sequences with {engine.name} ...")
    record = _run_engine(target, file, aux_ids, engine, install, folder / SCRATCH, progress)
    shutil.rmtree(folder / SCRATCH, ignore_errors=True)
    tokens = sum(len(s) for s in sequences)
    run_s = float(record["run_s"])
    return write_info(
        folder,
        {
            "format": CAPTURE_FORMAT,
            "target": str(target),
            **(source or CaptureSource()),
            "aux_layer_ids": list(aux_ids),
            "target_hidden_size": config.get("hidden_size"),
            "vocab_size": config.get("vocab_size"),
            "sequences": len(sequences),
            "seq_len": max(len(s) for s in sequences),
            "tokens": tokens,
            "embeddings": embed is not None,
            "engine": record,
            "tokens_per_s": round(tokens / run_s, 1) if run_s > 0 else None,
        },
    )


def _run_engine(
    target: Path,
    file: Any,
    aux_ids: tuple[int, ...],
    engine: CaptureEngine,
    install: VllmInstall | None,
    scratch: Path,
    progress: Callable[[str], None],
) -> TransformersRun | VllmRun:
    if install is None:
        # lazy: torch-free core
        from eaglequant.capture.hf_engine import capture_transformers

        return capture_transformers(target, file, aux_ids, engine.trust_remote_code)

    options = engine.options
    if options.max_model_len is None and "max_model_len" not in options.engine_args:
        options = replace(options, max_model_len=file.seq_len + 1)
    if engine.trust_remote_code:
        options = replace(options, engine_args={**options.engine_args, "trust_remote_code": True})
    return capture_vllm(
        target,
        file,
        aux_ids,
        options=options,
        install=install,
        replicas=engine.data_parallel_size,
        scratch=scratch,
        timeout_s=engine.timeout_s,
        progress=progress,
    )


@dataclass(frozen=True, kw_only=True)
class CaptureRequest:
    """``eaglequant capture``: ``aux_layers`` None takes the draft's, else vLLM's default."""

    target: Path
    data: Path | PromptSource
    out: Path
    engine: CaptureEngine
    draft: Path | None = None
    aux_layers: tuple[int, ...] | None = None
    samples: int = 72
    seq_len: int = 256
    embeddings: bool = False
    overwrite: bool = False


def capture_hidden_states(
    request: CaptureRequest, progress: Callable[[str], None] = lambda _m: None
) -> CaptureInfo:
    """Check everything, run the target, publish ``out`` atomically; return capture.json's data."""
    check_output_path(request.out, [request.target], request.overwrite)
    ids = aux_layer_ids(request.target, request.draft, request.aux_layers)
    check_data(request.data)
    check_engine(request.engine)
    tokenized = tokenize_data(
        request.target,
        request.data,
        request.seq_len,
        request.samples,
        request.engine.trust_remote_code,
    )
    with atomic_output_dir(request.out, request.overwrite) as temp:
        info = capture_into(
            temp,
            target=request.target,
            sequences=tokenized.sequences,
            aux_ids=ids,
            engine=request.engine,
            embeddings=request.embeddings,
            source={"data": tokenized.provenance, "draft_checked": request.draft is not None},
            progress=progress,
        )
    return info


def aux_layer_ids(
    target: Path, draft: Path | None, asked: tuple[int, ...] | None
) -> tuple[int, ...]:
    """The asked layers, else the draft's (checked against the target), else vLLM's default."""
    _config, layers = target_layers(target)
    fitted = None
    if draft is not None:
        fitted = check_target_fits(
            target, require_bf16_draft(read_checkpoint(draft), "capture's draft")
        )
    if asked:
        if fitted is not None and len(asked) != len(fitted):
            raise InputError(
                f"{draft}: the draft's fc takes {len(fitted)} auxiliary states, {len(asked)} "
                "layer ids were asked; ask for as many as the draft takes"
            )
        return check_aux_layers(target, asked, layers)
    return fitted or check_aux_layers(target, default_aux_layers(layers), layers)
