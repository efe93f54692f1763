"""A draft's linears as vLLM names them, and each one's fate under the draft's quantization.

For an EAGLE-3 draft vLLM's names are ``model.fc``, ``lm_head`` and
``model.layers.<N+i>.self_attn.qkv_proj`` (checked through its shards
``q_proj``/``k_proj``/``v_proj``), ``…o_proj``, ``…mlp.gate_up_proj`` (shards
``gate_proj``/``up_proj``), ``…down_proj`` for draft layer i (``midlayer`` is 0,
``layers.i`` after it), with N the target's layer count. An MLA draft's attention is named
as in :mod:`eaglequant.forms.mla` (``fused_qkv_a_proj`` with shards
``q_a_proj``/``kv_a_proj_with_mqa``, ``q_b_proj``, ``kv_b_proj``, ``o_proj``). What each
quantization method makes of those names is its module's in :mod:`eaglequant.quantization`
(Quark's ``exclude``, ModelOpt's ``exclude_modules``/``ignore``, compressed-tensors'
``ignore`` and targets, ``fp8``'s ``ignored_layers``).
"""

from __future__ import annotations

from eaglequant.forms import form_of
from eaglequant.forms.llama import LLAMA
from eaglequant.io.model_config import DraftConfig
from eaglequant.quantization import predict
from eaglequant.quantization.base import LayerFate
from eaglequant.quantization.matching import is_equal_or_regex_match
from eaglequant.quantization.quark import (
    CARD_REGEX,
    FUSED_SHARDS,
    describe_scheme,
    rewrite_exclude,
    vllm_scheme,
)
from eaglequant.quantization.quark import (
    METHOD as QUARK,
)

# The draft's linears outside its decoder layers, in every form (vLLM name -> checkpoint).
KEPT_OUTSIDE_LAYERS = {"model.fc": ("fc",), "lm_head": ("lm_head",)}
DEFAULT_TARGET_LAYERS = 32

__all__ = [
    "CARD_REGEX",
    "DEFAULT_TARGET_LAYERS",
    "FUSED_SHARDS",
    "KEPT_OUTSIDE_LAYERS",
    "LayerFate",
    "describe_scheme",
    "draft_layer_count",
    "draft_linear_names",
    "is_excluded",
    "matches",
    "predict_fates",
    "rewrite_exclude",
    "vllm_linear_names",
    "vllm_scheme",
]


def vllm_linear_names(target_layers: int, draft_layers: int = 1) -> dict[str, tuple[str, ...]]:
    """vLLM module name -> the checkpoint modules it is built from, every Llama draft layer's."""
    return LLAMA.vllm_linear_names({}, target_layers, draft_layers) | KEPT_OUTSIDE_LAYERS


def draft_layer_count(config: DraftConfig) -> int:
    """The config's num_hidden_layers (1 when absent or invalid: the draft checks report it)."""
    layers = config.get("num_hidden_layers")
    return layers if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 else 1


def draft_linear_names(config: DraftConfig, target_layers: int) -> dict[str, tuple[str, ...]]:
    """:func:`vllm_linear_names` for this draft's form (an MLA draft's own attention names)."""
    form = form_of(config) or LLAMA
    layers = draft_layer_count(config)
    return form.vllm_linear_names(config, target_layers, layers) | KEPT_OUTSIDE_LAYERS


def matches(name: str, entry: str) -> bool:
    """vLLM's rule for one Quark or compressed-tensors entry: equal, or ``re:`` matched."""
    return is_equal_or_regex_match(name, entry)


def is_excluded(vllm_name: str, exclude: list[str]) -> bool:
    """Quark's ``should_ignore_layer``: a direct match, else every fused shard matches.

    Raises ValueError, as vLLM does, when only some shards of a fused layer match.
    """
    return QUARK.excluded(vllm_name, exclude)


def predict_fates(
    draft: DraftConfig, target_layers: int = DEFAULT_TARGET_LAYERS
) -> list[LayerFate]:
    """Predict vLLM's treatment of every draft linear under ``draft``'s quantization_config
    (a checkpoint's config, as vLLM reads it), by the rule of the method it declares."""
    return predict(draft.get("quantization_config"), draft_linear_names(draft, target_layers))
