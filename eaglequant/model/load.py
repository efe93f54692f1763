"""Load a checked BF16 draft checkpoint into the torch draft module.

The decoder layers (what Quark quantizes) and the norms are float32, so Quark's
scales and FP8 values come from float32 math (the layers' linears still
round their inputs and outputs to BF16 as vLLM's do). ``fc``, ``lm_head`` and
``embed_tokens`` stay in the checkpoint's dtype: they are not quantized, vLLM
runs them in BF16 too, and at full size (two 163840 x 7168 matrices) float32
copies would double the memory. They are mapped from their files
(copy-on-write), not read: an embedding lookup pages in only the rows it
touches. The module is built on the meta device and the loaded tensors are
assigned, so no weight is ever allocated twice.
"""

from __future__ import annotations

import mmap

import torch
from torch import nn
from transformers import LlamaConfig

from eaglequant.errors import InputError
from eaglequant.io.checkpoint import Checkpoint
from eaglequant.io.layout import torch_dtypes
from eaglequant.io.safetensors_header import FLOAT_DTYPES, TensorInfo
from eaglequant.model.eagle3 import Eagle3Draft, FileMappings, MidLayer, UpcastLinear
from eaglequant.model.finite import check_finite, require_finite
from eaglequant.rules.draft import FIRST_LAYER, dims_from_config

KEPT_IN_STORED_DTYPE = ("fc.", "lm_head.", "embed_tokens.")


def load_draft_module(ckpt: Checkpoint, check_unquantized: bool = True) -> Eagle3Draft:
    """Build the module and fill every parameter and buffer from the checkpoint.

    Weights are checked for NaN/Inf while loading (the error names the tensor);
    ``check_unquantized=False`` leaves that to the caller for fc, lm_head and
    embed_tokens (the export checks them as it reads its output back).
    """
    has_embed = "embed_tokens.weight" in ckpt.tensors
    with torch.device("meta"):
        model = Eagle3Draft(LlamaConfig(**ckpt.config), with_embeddings=has_embed)
    names = [name for name in model.state_dict() if name not in ("d2t", "t2d")]
    mappings = FileMappings()
    state = {name: _load(ckpt, name, check_unquantized, mappings) for name in names}
    dims = model.dims
    state["d2t"] = _load(ckpt, "d2t") if "d2t" in ckpt.tensors else torch.zeros(dims.draft_vocab)
    state["t2d"] = _load(ckpt, "t2d") if "t2d" in ckpt.tensors else torch.ones(dims.vocab)
    state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
    model.load_state_dict(state, assign=True)
    model.file_mappings = mappings
    return model.eval()


def load_reference_layer(ckpt: Checkpoint, prefix: str) -> MidLayer:
    """The decoder layer at ``prefix`` as stored (BF16 linears): the reference after Quark's run.

    Half the memory of a float32 copy, the same results: every BF16 weight is exact
    in float32, and :class:`UpcastLinear` computes in its input's dtype (BF16
    where BF16 GEMMs are native, else float32).
    """
    with torch.device("meta"):
        layer = MidLayer(dims_from_config(ckpt.flat_config), first=prefix == FIRST_LAYER)
    linears = {n: m for n, m in layer.named_modules() if isinstance(m, nn.Linear)}
    for name, module in linears.items():  # every linear of the form (an MLA kv_b_proj too)
        parent, child = name.rsplit(".", 1)
        weight = ckpt.load_tensor(f"{prefix}.{name}.weight")
        bias = None if module.bias is None else ckpt.load_tensor(f"{prefix}.{name}.bias")
        setattr(layer.get_submodule(parent), child, UpcastLinear(weight, bias))
    norms = {n: _load(ckpt, f"{prefix}.{n}") for n in layer.state_dict() if "norm" in n}
    layer.load_state_dict(norms, strict=False, assign=True)
    return layer.eval()


def _load(
    ckpt: Checkpoint, name: str, check: bool = True, mappings: list[mmap.mmap] | None = None
) -> torch.Tensor:
    if name not in ckpt.tensors:
        raise InputError(f"{ckpt.folder}: tensor '{name}' is missing; re-export the draft")
    info = ckpt.tensors[name]
    if info.dtype not in FLOAT_DTYPES:
        return ckpt.load_tensor(name)
    if name.startswith(KEPT_IN_STORED_DTYPE):
        if check:
            check_finite(info)  # from the file: the mapping's pages stay untouched
        tensor, mapping = map_tensor(info)
        if mappings is not None:
            mappings.append(mapping)
        return tensor
    tensor = ckpt.load_tensor(name)
    require_finite(info, tensor)
    return tensor.float()


def map_tensor(info: TensorInfo) -> tuple[torch.Tensor, mmap.mmap]:
    """The tensor mapped from its file, copy-on-write: pages are read when first touched."""
    with info.file.open("rb") as handle:
        page_start = info.start - info.start % mmap.ALLOCATIONGRANULARITY
        length = max(info.end - page_start, 1)
        mapped = mmap.mmap(handle.fileno(), length, access=mmap.ACCESS_COPY, offset=page_start)
    if not info.nbytes:
        return torch.empty(info.shape, dtype=torch_dtypes()[info.dtype]), mapped
    flat = torch.frombuffer(
        mapped, dtype=torch.uint8, count=info.nbytes, offset=info.start - page_start
    )
    return flat.view(torch_dtypes()[info.dtype]).reshape(info.shape), mapped
