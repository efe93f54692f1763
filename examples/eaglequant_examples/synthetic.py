"""Synthetic EAGLE-3 drafts with random weights, for tests and benchmarks.

Tensors are generated and written one at a time, so even a full-size
(Kimi-K2.5-shaped, ~6.4 GB) draft never sits in memory whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from eaglequant.io import speculators
from eaglequant.io.layout import blob_from_tensor
from eaglequant.io.model_config import DraftConfig
from eaglequant.io.writer import write_checkpoint_weights, write_text
from eaglequant.rules.draft import dims_from_config, expected_shapes, optional_shapes


def draft_config(
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    vocab: int = 256,
    draft_vocab: int | None = 128,
    target_hidden: int | None = None,
    aux_layer_ids: tuple[int, ...] | None = (1, 2, 3),
    **extra: Any,
) -> dict[str, Any]:
    """A ``LlamaForCausalLMEagle3`` config.json (the tiny test shape by default)."""
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "intermediate_size": intermediate,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if draft_vocab is not None:
        config["draft_vocab_size"] = draft_vocab
    if target_hidden is not None:
        config["target_hidden_size"] = target_hidden
    if aux_layer_ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = list(aux_layer_ids)
    config.update(extra)
    return config


def write_random_draft(
    folder: Path,
    config: dict[str, Any],
    seed: int = 0,
    max_shard_size: int = 5 * 10**9,
    with_embeddings: bool = True,
    speculators_verifier: str | None = None,
) -> Path:
    """Write a random BF16 draft for ``config`` into ``folder`` (created).

    With ``speculators_verifier`` (the target's name or path) the folder is in the
    speculators format, the same tensors under its names.
    """
    import torch

    dims = dims_from_config(cast(DraftConfig, config))
    generator = torch.Generator().manual_seed(seed)
    shapes = expected_shapes(dims) | optional_shapes(dims)
    if not with_embeddings:
        shapes.pop("embed_tokens.weight")
    target_ids = torch.randperm(dims.vocab, generator=generator)[: dims.draft_vocab].sort().values
    maps = {
        "d2t": target_ids - torch.arange(dims.draft_vocab),
        "t2d": vocab_mask(target_ids, dims.vocab),
    }
    tensors = (
        (name, maps[name] if name in maps else _random_weight(shape, generator))
        for name, shape in sorted(shapes.items())
    )
    return write_draft(folder, config, tensors, max_shard_size, speculators_verifier)


def write_draft(
    folder: Path,
    config: dict[str, Any],
    tensors: Iterable[tuple[str, Any]],
    max_shard_size: int,
    speculators_verifier: str | None = None,
) -> Path:
    """Write ``tensors`` (EAGLE-3 names) and ``config`` (flat) as a draft folder (created).

    With ``speculators_verifier`` (the target's name or path) the folder is in the
    speculators format, the same tensors under its names.
    """
    folder.mkdir(parents=True, exist_ok=True)
    flat = cast(DraftConfig, config)  # the JSON object transformers' LlamaConfig is built from
    prefix = speculators.layer_prefix(flat, speculators_verifier is not None)
    blobs = [blob_from_tensor(speculators.stored_name(n, prefix), t) for n, t in tensors]
    write_checkpoint_weights(folder, blobs, max_shard_size)
    stored: DraftConfig = flat
    if speculators_verifier is not None:
        stored = speculators.from_flat_config(flat, verifier=speculators_verifier)
    write_text(folder / "config.json", json.dumps(stored, indent=2) + "\n")
    return folder


def vocab_mask(target_ids: Any, vocab: int) -> Any:
    """``t2d``: which target token ids the draft vocabulary holds."""
    import torch

    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[target_ids] = True
    return mask


def _random_weight(shape: tuple[int, ...], generator: Any) -> Any:
    import torch

    if len(shape) == 1:
        return torch.ones(shape, dtype=torch.bfloat16)
    std = shape[-1] ** -0.5
    return (torch.randn(shape, generator=generator) * std).to(torch.bfloat16)
