"""Check 6's measured ranges from vLLM itself: each draft linear's input and output amax.

In the worker (through validate's worker extension), :func:`watch` puts a forward hook on
every linear of the draft vLLM built and :func:`collect` reads and removes them, so the
ranges are those of the draft exactly as vLLM runs it, on the validation prompts, in the
same speculative engine that validate runs anyway (no capture, no second target load).
vLLM fuses projections (``qkv_proj``, ``gate_up_proj``): a fused linear's input is each
part's input, and its output is split by vLLM's own partition sizes into each part's output.
Beside the ranges, each floating-point input and each K/V projection's output parts are summed
into histograms of |x| (``scale_effects.Magnitudes``), on which check 6 judges the scales.

:func:`checkpoint_ranges` maps them to the checkpoint's linear names. A linear it cannot
map, or one the hooks never saw called (a draft run under CUDA graphs replays without
hooks), makes it return the reason instead, and check 6 captures the target's states as
before: nothing observed is never judged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from eaglequant.engine import vllm_internals
from eaglequant.results.engine_result import LinearRange

WATCH_ATTRIBUTE = "_eaglequant_range_watch"
# A checkpoint linear's part in vLLM's fused linear: (fused name, part index).
FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
CHECKPOINT_LAYER = re.compile(r"^(?:midlayer|(?:model\.)?layers\.(\d+))\.(.+)$")
VLLM_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$")
Ranges = dict[str, LinearRange]  # by vLLM's linear name
KV_PROJECTIONS = ("qkv_proj", "k_proj", "v_proj")  # whose output parts K/V scales quantize


def watch(worker: Any) -> int:
    """On the worker: hook every linear of the current draft; how many were hooked."""
    # lazy: torch-free core
    import torch

    stats: Ranges = {}
    magnitudes: dict[str, Histograms] = {}
    handles = []
    for name, module in vllm_internals.draft_model(worker).named_modules():
        weight = getattr(module, "weight", None)
        if getattr(module, "quant_method", None) is None or not isinstance(weight, torch.Tensor):
            continue
        parts = [int(p) for p in getattr(module, "output_partition_sizes", None) or []]
        record = _recorder(name, parts, stats, magnitudes)
        handles.append(module.register_forward_hook(record))
    collect(worker)
    setattr(worker, WATCH_ATTRIBUTE, (handles, stats, magnitudes))
    return len(handles)


def collect(worker: Any) -> Ranges:
    """On the worker: the ranges seen since :func:`watch`, its hooks removed."""
    handles, stats, magnitudes = getattr(worker, WATCH_ATTRIBUTE, ([], {}, {}))
    for handle in handles:
        handle.remove()
    if hasattr(worker, WATCH_ATTRIBUTE):
        delattr(worker, WATCH_ATTRIBUTE)
    for name, (inputs, outputs) in magnitudes.items():
        stats[name]["input_magnitudes"] = inputs.to_json()
        if outputs:
            stats[name]["output_magnitudes"] = [part.to_json() for part in outputs]
    return stats


# A linear's histograms: of its input, and of each output part (K/V projections only).
Histograms = tuple[Any, list[Any]]


def _recorder(name: str, parts: list[int], stats: Ranges, magnitudes: dict[str, Any]) -> Any:
    # lazy: torch-free core
    from eaglequant.validate.scale_effects import Magnitudes

    outputs_too = name.rpartition(".")[2] in KV_PROJECTIONS

    def record(_module: Any, args: tuple[Any, ...], output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        entry = stats.setdefault(name, {"calls": 0, "input_amax": 0.0, "output_amax": []})
        entry["calls"] += 1
        entry["input_amax"] = max(entry["input_amax"], float(args[0].detach().abs().max()))
        pieces = out.split(parts, dim=-1) if sum(parts) == out.shape[-1] else (out,)
        seen = [float(p.detach().abs().max()) if p.numel() else 0.0 for p in pieces]
        before = entry["output_amax"] or [0.0] * len(seen)
        entry["output_amax"] = [max(a, b) for a, b in zip(before, seen, strict=True)]
        if not args[0].is_floating_point():
            return  # an embedding's token ids
        inputs, outputs = magnitudes.setdefault(name, (Magnitudes(), []))
        inputs.add(args[0])
        if outputs_too:
            outputs += [Magnitudes() for _ in pieces[len(outputs) :]]
            for histogram, piece in zip(outputs, pieces, strict=False):
                histogram.add(piece)

    return record


def checkpoint_ranges(
    ranges: Mapping[str, LinearRange], linears: tuple[str, ...]
) -> tuple[dict[str, float], dict[str, float]] | str:
    """Each checkpoint linear's (input amax, output amax) from vLLM's ranges, or why not."""
    found = checkpoint_entries(ranges, linears)
    if isinstance(found, str):
        return found
    inputs = {linear: float(entry["input_amax"]) for linear, (entry, _) in found.items()}
    outputs = {linear: float(entry["output_amax"][part]) for linear, (entry, part) in found.items()}
    return inputs, outputs


def checkpoint_entries(
    ranges: Mapping[str, LinearRange], linears: tuple[str, ...]
) -> dict[str, tuple[LinearRange, int]] | str:
    """Each checkpoint linear's entry in vLLM's ranges and its part of that linear's output
    (a decoder-layer linear by layer ordinal and vLLM's fused name; ``fc`` as ``model.fc``),
    or why one cannot be found."""
    layers: dict[int, dict[str, LinearRange]] = {}
    for name, entry in ranges.items():
        match = VLLM_LAYER.match(name)
        if match:
            layers.setdefault(int(match[1]), {})[match[2]] = entry
    ordered = [layers[i] for i in sorted(layers)]
    entries: dict[str, tuple[LinearRange, int]] = {}
    for linear in linears:
        match = CHECKPOINT_LAYER.match(linear)
        if match is None:
            fused, part = linear, 0
            found = ranges.get(f"model.{linear}", ranges.get(linear))
            if found is None:
                return f"{linear}: vLLM's draft has no linear model.{linear} or {linear}"
        else:
            ordinal, within = int(match[1] or 0), match[2]
            fused, part = FUSED.get(within, (within, 0))
            found = ordered[ordinal].get(fused) if ordinal < len(ordered) else None
            if found is None:
                return f"vLLM's draft has no {fused} in its decoder layer {ordinal} (for {linear})"
        if not found["calls"]:
            return f"vLLM's {fused} was never seen running (for {linear})"
        if len(found["output_amax"]) <= part:
            return f"vLLM's {fused} output could not be split into its parts (for {linear})"
        entries[linear] = (found, part)
    return entries
