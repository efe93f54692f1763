"""The speculators draft format (vllm-project/speculators), read and written as vLLM does.

A speculators config nests the decoder's Llama config under
``transformer_layer_config`` and keeps the EAGLE-3 fields (``draft_vocab_size``,
``norm_before_residual``, …) and ``speculators_config`` (proposal methods,
verifier) at the top. vLLM (``transformers_utils/configs/speculators/``)
flattens it: the layer config, plus the EAGLE-3 fields, ``norm_before_residual``
defaulting to *true*, the architecture chosen by the layer config's
``model_type``. Its ``quantization_config`` is the top-level one when there is
one (vLLM's ``get_config`` sets it from the raw file after the flattening),
else the layer config's.
Tensors are stored as ``layers.0.*`` where the EAGLE-3 layout has ``midlayer.*``
(a Qwen3 draft too, in either format: vLLM's Qwen3 draft model has no other name).

:func:`flat_config` gives vLLM's view, :func:`layer_prefix`, :func:`canonical_name`
and :func:`stored_name` translate tensor names, :func:`with_quantization_config`
writes a quantization config at the top level, where vLLM reads it first.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from eaglequant.io.model_config import DraftConfig, ModelConfig, QuantizationConfig, StoredConfig

SPECULATORS_KEY: Final = "speculators_config"
LAYER_CONFIG: Final = "transformer_layer_config"
CANONICAL_PREFIX = "midlayer."
STORED_PREFIX = "layers.0."
# vLLM's update_eagle3: top-level fields copied into the flat config, with their defaults.
Eagle3Field = Literal["norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"]
EAGLE3_FIELDS: dict[Eagle3Field, bool] = {
    "norm_before_residual": True,
    "norm_before_fc": False,
    "fc_norm": False,
    "norm_output": False,
}
EAGLE3_ARCHITECTURES = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}
LAYER_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def is_speculators(config: StoredConfig) -> bool:
    """Whether ``config`` is in the speculators format (vLLM's own test)."""
    return config.get(SPECULATORS_KEY) is not None


def structure_problem(config: StoredConfig) -> str | None:
    """What vLLM would refuse in a speculators config's structure, or None."""
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        return f"speculators_model_type is {kind!r}, not 'eagle3'"
    if not _has_path(config, SPECULATORS_KEY, "proposal_methods", 0, "speculative_tokens") or (
        not _has_path(config, SPECULATORS_KEY, "verifier", "name_or_path")
    ):
        return (
            f"{SPECULATORS_KEY} lacks proposal_methods[0].speculative_tokens or "
            "verifier.name_or_path, which vLLM requires"
        )
    if not isinstance(config.get(LAYER_CONFIG), dict):
        return f"'{LAYER_CONFIG}' is missing or not an object"
    model_type = config[LAYER_CONFIG].get("model_type", "llama")
    if model_type not in EAGLE3_ARCHITECTURES:
        return f"{LAYER_CONFIG}.model_type {model_type!r} is not one vLLM serves as EAGLE-3"
    return None


def _has_path(node: Any, *keys: str | int) -> bool:
    for key in keys:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return False
    return True


def flat_config(config: StoredConfig) -> DraftConfig:
    """The config as vLLM sees it: a speculators config flattened, any other as it is.

    Call only on a config without :func:`structure_problem`.
    """
    if not is_speculators(config):
        return config
    flat: DraftConfig = {**config[LAYER_CONFIG]}
    flat["draft_vocab_size"] = config.get("draft_vocab_size")
    if config.get("target_hidden_size") is not None:
        flat["target_hidden_size"] = config["target_hidden_size"]
    for key, default in EAGLE3_FIELDS.items():
        flat[key] = config.get(key, default)
    flat["architectures"] = [EAGLE3_ARCHITECTURES[flat.get("model_type", "llama")]]
    if config.get("eagle_aux_hidden_state_layer_ids"):
        flat["eagle_aux_hidden_state_layer_ids"] = config["eagle_aux_hidden_state_layer_ids"]
    if config.get("quantization_config") is not None:
        flat["quantization_config"] = config["quantization_config"]
    return flat


def layer_prefix(flat: ModelConfig, in_speculators: bool) -> str:
    """How the folder names the decoder layer's tensors: ``layers.0.`` or ``midlayer.``.

    The speculators format names it ``layers.0``; so must a Qwen3 draft in any
    format (vLLM's Eagle3Qwen3ForCausalLM maps no ``midlayer.`` names).
    """
    qwen3 = EAGLE3_ARCHITECTURES["qwen3"] in vllm_architectures(flat)
    return STORED_PREFIX if in_speculators or qwen3 else CANONICAL_PREFIX


def vllm_architectures(flat: ModelConfig) -> list[str]:
    """The config's architectures as vLLM renames them for method eagle3 (EAGLEConfig)."""
    names = [str(a) for a in flat.get("architectures") or []]
    return [a if a.startswith("Eagle3") or a.endswith("Eagle3") else f"Eagle3{a}" for a in names]


def canonical_name(stored: str, prefix: str) -> str:
    """A stored tensor name in the EAGLE-3 layout (``layers.0.x`` -> ``midlayer.x``)."""
    if prefix != CANONICAL_PREFIX and stored.startswith(prefix):
        return CANONICAL_PREFIX + stored.removeprefix(prefix)
    return stored


def stored_name(canonical: str, prefix: str) -> str:
    """The name an EAGLE-3-layout tensor has in a folder whose layer prefix is ``prefix``."""
    if canonical.startswith(CANONICAL_PREFIX):
        return prefix + canonical.removeprefix(CANONICAL_PREFIX)
    return canonical


def with_quantization_config(config: StoredConfig, qcfg: QuantizationConfig) -> StoredConfig:
    """``config`` with ``qcfg`` at the top level, where vLLM reads it first in either format.

    A speculators layer config's own copy, which vLLM would then never read, is dropped.
    """
    config = {**config, "quantization_config": qcfg}
    layer = config.get(LAYER_CONFIG)
    if is_speculators(config) and isinstance(layer, dict) and "quantization_config" in layer:
        layer = {**layer}
        del layer["quantization_config"]
        config[LAYER_CONFIG] = layer
    return config


def from_flat_config(
    flat: DraftConfig, *, verifier: str, speculative_tokens: int = 3
) -> StoredConfig:
    """A speculators-format config holding the EAGLE-3 draft described by ``flat``.

    Laid out as vllm-project/speculators writes Eagle3SpeculatorConfig: the EAGLE-3
    fields at the top (``norm_before_residual`` always written: vLLM's default for
    an absent one is true), the decoder's Llama config under
    ``transformer_layer_config``, ``verifier`` naming the target model.
    """
    top: StoredConfig = {}
    layer: DraftConfig = {**flat}
    if flat.get("draft_vocab_size") is not None:
        top["draft_vocab_size"] = layer.pop("draft_vocab_size")
    if flat.get("target_hidden_size") is not None:
        top["target_hidden_size"] = layer.pop("target_hidden_size")
    if flat.get("eagle_aux_hidden_state_layer_ids") is not None:
        top["eagle_aux_hidden_state_layer_ids"] = layer.pop("eagle_aux_hidden_state_layer_ids")
    for key in EAGLE3_FIELDS:
        top[key] = bool(layer.pop(key, False))
    layer.pop("architectures", None)
    layer.pop("quantization_config", None)
    layer["architectures"] = [LAYER_ARCHITECTURES[layer.get("model_type", "llama")]]
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        **top,
        LAYER_CONFIG: layer,
        SPECULATORS_KEY: {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": speculative_tokens}
            ],
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
    }
