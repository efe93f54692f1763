"""Swapping the EAGLE-3 draft inside a running vLLM engine (worker side).

Runs in each vLLM worker (``collective_rpc("eaglequant_swap_draft")`` through
validate's worker extension), after vLLM is imported there. The next draft's
model is built under its own ``SpeculativeConfig`` (its own quantization) by the
proposer's own ``load_model(target_model)``, so it shares the loaded target's
embeddings and ``lm_head`` exactly as at engine start; the draft's attention
layers keep their names, and the KV cache tensors vLLM allocated for them at
start are bound to the new layers. The caller resets the prefix cache between
runs, so no block computed by the previous draft is read again.

Refused (the engine is left as it was) when the drafts differ in anything the
allocated cache or the target's hidden-state outputs depend on, when the draft
runs under CUDA graphs or ``torch.compile`` (captured graphs keep the old
weights), or when vLLM lacks a hook this relies on.

What it relies on in vLLM is reached through :mod:`eaglequant.engine.vllm_internals`
(the V1 runner's proposer, its attention layer names, the forward context, the KV-cache
binding); under Model Runner V2 the swap is refused there, by name.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Literal, TypedDict

from eaglequant.engine import vllm_internals as internals
from eaglequant.rules.speculative import SpeculativeDict

# The speculative settings the engine was planned with; a swap keeps them.
KeptSetting = Literal["method", "num_speculative_tokens", "draft_tensor_parallel_size"]
KEPT_SETTINGS: tuple[KeptSetting, ...] = (
    "method",
    "num_speculative_tokens",
    "draft_tensor_parallel_size",
)


class SwapOutcome(TypedDict):
    """One worker's swap: done, or why not (``reason``), and how long it took."""

    ok: bool
    reason: str
    swap_s: float


class SwapRefused(Exception):
    """The swap cannot be done safely; the message says why."""


def swap_draft(worker: Any, speculative: SpeculativeDict) -> SwapOutcome:
    """Replace the worker's draft by ``speculative["model"]``."""
    started = time.perf_counter()
    try:
        _swap(worker, speculative)
    except SwapRefused as exc:
        return {"ok": False, "reason": str(exc), "swap_s": 0.0}
    return {"ok": True, "reason": "", "swap_s": round(time.perf_counter() - started, 2)}


def _swap(worker: Any, speculative: SpeculativeDict) -> None:
    # lazy: vllm is an optional extra
    from vllm.config import SpeculativeConfig, set_current_vllm_config

    runner = internals.runner_of(worker)
    try:
        proposer = internals.draft_proposer(runner)
    except internals.MissingHook as exc:
        raise SwapRefused(str(exc)) from exc
    config = runner.vllm_config
    _check_eager(config)
    current = config.speculative_config
    for key in KEPT_SETTINGS:
        if key in speculative and speculative[key] != getattr(current, key):
            raise SwapRefused(f"{key} {speculative[key]!r} differs from the engine's")
    try:
        following = SpeculativeConfig(
            **speculative,
            target_model_config=config.model_config,
            target_parallel_config=config.parallel_config,
        )
    except Exception as exc:  # vLLM's own refusal of the draft, named
        raise SwapRefused(f"vLLM refuses the draft: {exc}") from exc
    _check_same_shape(current.draft_model_config.hf_config, following.draft_model_config.hf_config)

    forward = internals.forward_context(config)
    names = internals.draft_attention_names(proposer)
    specs = {n: forward[n].get_kv_cache_spec(config) for n in names}
    caches = {n: forward[n].kv_cache for n in names}
    saved = _Saved(current, proposer, forward, names)
    _install(current, proposer, following)
    try:
        with set_current_vllm_config(config):
            internals.rebuild_draft(runner, proposer)
        _check_same_layers(proposer, forward, config, specs)
    except Exception as exc:
        saved.restore(forward)
        raise SwapRefused(f"the rebuilt draft does not fit the engine: {exc}") from exc
    internals.bind_draft_attention(runner, proposer, caches)
    del saved
    gc.collect()


def _check_eager(config: Any) -> None:
    # lazy: vllm is an optional extra
    from vllm.config import CompilationMode, CUDAGraphMode

    compilation = config.compilation_config
    if compilation.mode != CompilationMode.NONE or compilation.cudagraph_mode not in (
        None,
        CUDAGraphMode.NONE,
    ):
        raise SwapRefused(
            "the engine compiles or graph-captures the draft (captured graphs keep the old "
            "draft's weights); run it eager (enforce_eager=true)"
        )


# Draft config keys the allocated KV cache, the proposer's buffers and the target's
# auxiliary hidden-state outputs were built from.
SHAPE_KEYS = (
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "max_position_embeddings",
)


def _check_same_shape(current: Any, following: Any) -> None:
    for key in SHAPE_KEYS:
        before, after = getattr(current, key, None), getattr(following, key, None)
        if before != after:
            raise SwapRefused(f"the drafts differ in {key} ({before!r} vs {after!r})")


def _install(current: Any, proposer: Any, following: Any) -> None:
    """The engine's speculative config (runner, proposer and loader share it) names the next."""
    current.model = following.model
    current.quantization = following.quantization
    current.draft_model_config = following.draft_model_config
    proposer.draft_model_config = following.draft_model_config


def _check_same_layers(proposer: Any, forward: dict, config: Any, specs: dict) -> None:
    names = internals.draft_attention_names(proposer)
    if names != sorted(specs):
        raise SwapRefused(f"attention layers {names} differ from {sorted(specs)}")
    for name in names:
        if forward[name].get_kv_cache_spec(config) != specs[name]:
            raise SwapRefused(f"{name}'s KV cache layout differs")


class _Saved:
    """What a refused rebuild puts back: the old model, its config and its attention layers."""

    def __init__(self, current: Any, proposer: Any, forward: dict, names: list[str]) -> None:
        self.current, self.proposer = current, proposer
        self.layers = {n: forward.pop(n) for n in names}
        self.target_names = set(forward)
        self.values = {k: getattr(current, k) for k in ("model", "quantization")}
        self.model_config = current.draft_model_config
        self.model = proposer.model
        self.names = set(names)

    def restore(self, forward: dict[str, Any]) -> None:
        for name in set(forward) - self.target_names:
            forward.pop(name)
        forward.update(self.layers)
        for key, value in self.values.items():
            setattr(self.current, key, value)
        self.current.draft_model_config = self.model_config
        self.proposer.draft_model_config = self.model_config
        self.proposer.model = self.model
        internals.set_draft_attention_names(self.proposer, self.names)
