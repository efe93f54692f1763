"""Load a checked BF16 draft checkpoint into the torch draft module (float32 math)."""

from __future__ import annotations

import torch
from eaglequant.quantize.draft_model import Eagle3Draft
from transformers import LlamaConfig

from eaglequant.checkpoint import Checkpoint
from eaglequant.errors import InputError


def load_draft_module(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> Eagle3Draft:
    """Build the module and fill every parameter and buffer from the checkpoint.

    Weights are checked for NaN/Inf while loading; the error names the tensor.
    """
    has_embed = "embed_tokens.weight" in ckpt.tensors
    model = Eagle3Draft(LlamaConfig(**ckpt.config), with_embeddings=has_embed)
    state = {}
    for name in model.state_dict():
        if name not in ckpt.tensors:
            if name in ("d2t", "t2d"):
                continue
            raise InputError(f"{ckpt.folder}: tensor '{name}' is missing; re-export the draft")
        tensor = ckpt.load_tensor(name)
        if tensor.is_floating_point():
            _check_finite(ckpt, name, tensor)
            tensor = tensor.to(dtype)
        state[name] = tensor
    model.load_state_dict(state, strict=False)
    return model.to(dtype).eval()


def _check_finite(ckpt: Checkpoint, name: str, tensor: torch.Tensor) -> None:
    if not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise InputError(
            f"{ckpt.tensors[name].file}: tensor '{name}' holds {bad} NaN/Inf value(s); "
            "the checkpoint is corrupt, re-export it from a healthy training run"
        )
