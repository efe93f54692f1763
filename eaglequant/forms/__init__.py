"""EAGLE-3 draft forms, one module each: recognised, refused, shaped and named in vLLM.

Every module of this package defines a :class:`~eaglequant.forms.base.DraftForm` and
registers it; importing the package imports them all, so adding a form is adding a module.
"""

from __future__ import annotations

import importlib
import pkgutil

from eaglequant.forms.base import DraftForm, registered
from eaglequant.io.model_config import DraftConfig, ModelConfig

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


def form_of(config: ModelConfig) -> DraftForm | None:
    """The form vLLM would serve ``config`` with (by architecture alone), or None."""
    # lazy: --help latency
    from eaglequant.io.speculators import vllm_architectures

    names = vllm_architectures(config)
    return next((f for f in registered() if f.claims(names)), None)


def form_named(family: str) -> DraftForm:
    """The registered form of this family (what :class:`~eaglequant.rules.draft.DraftDims`
    records)."""
    return next(f for f in registered() if f.family == family)


def recognised_form(config: DraftConfig, tensors: set[str]) -> DraftForm | None:
    """The form whose config or (for a plain config) tensors this draft has, or None."""
    return next((f for f in registered() if f.recognises(config, tensors)), None)


def fused_shards() -> dict[str, tuple[str, ...]]:
    """vLLM's fused module -> shard names, over every form."""
    found: dict[str, tuple[str, ...]] = {}
    for form in registered():
        found |= form.fused_shards
    return found
