"""Whether a target can feed a draft: its config's hidden size, vocabulary and layers, and
the auxiliary layers vLLM captures from it (read from ``config.json`` only, before any
weight or engine)."""

from __future__ import annotations

from pathlib import Path

from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_config
from eaglequant.io.model_config import ModelConfig
from eaglequant.rules.draft import DraftDims


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's default auxiliary layers for a target of ``num_layers`` layers."""
    return (2, num_layers // 2, num_layers - 3)


def check_target_fits(target_dir: Path, dims: DraftDims) -> tuple[int, ...]:
    """Read the target's config only; InputError when it cannot feed this draft.

    Returns the auxiliary layer ids in the order vLLM concatenates them (ascending).
    """
    config, layers = target_layers(target_dir)
    where = target_dir / "config.json"
    hidden, vocab = config.get("hidden_size"), config.get("vocab_size")
    if hidden != dims.target_hidden:
        raise InputError(
            f"{where}: hidden_size {hidden} does not fit the draft (target_hidden_size "
            f"{dims.target_hidden}); pass the target this draft was trained for"
        )
    if vocab != dims.vocab:
        raise InputError(
            f"{where}: vocab_size {vocab} differs from the draft's vocab_size {dims.vocab}; "
            "pass the target this draft was trained for"
        )
    ids = dims.aux_layer_ids or default_aux_layers(layers)
    if len(ids) != dims.num_aux or len(set(ids)) != len(ids):
        raise InputError(
            f"{where}: auxiliary layers {list(ids)} do not give {dims.num_aux} distinct states "
            "to fc; set eagle_aux_hidden_state_layer_ids in the draft config"
        )
    return check_aux_layers(target_dir, ids, layers)


def target_layers(target_dir: Path) -> tuple[ModelConfig, int]:
    """The target's (text) config and its number of decoder layers."""
    if not target_dir.is_dir():
        raise InputError(f"{target_dir}: no such target folder; pass the target model's folder")
    stored: ModelConfig = read_config(target_dir)
    config = stored.get("text_config", stored)
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        raise InputError(f"{target_dir / 'config.json'}: num_hidden_layers missing or invalid")
    return config, layers


def check_aux_layers(target_dir: Path, ids: tuple[int, ...], layers: int) -> tuple[int, ...]:
    """Distinct ids of this target's layers, ascending (vLLM's order); InputError otherwise.

    Id ``i`` names the hidden state entering decoder layer ``i`` (transformers'
    ``hidden_states[i]``; 0 is the embedding output), so ids run 0..layers-1.
    """
    where = target_dir / "config.json"
    if len(set(ids)) != len(ids):
        raise InputError(
            f"{where}: auxiliary layer ids {list(ids)} repeat a layer; vLLM captures each "
            "layer once, pass distinct ids"
        )
    outside = [i for i in ids if not 0 <= i < layers]
    if outside:
        raise InputError(
            f"{where}: auxiliary layer {outside[0]} is outside this {layers}-layer target "
            f"(ids 0..{layers - 1} name the hidden state entering each decoder layer); "
            "pass layer ids the target has"
        )
    return tuple(sorted(ids))
