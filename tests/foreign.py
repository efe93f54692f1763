"""Tiny quantized drafts as other producers lay them out, made in code from a BF16 draft.

The weights of the named modules become FP8 E4M3 with their scales (per tensor, per channel
or per block; a static input scale where asked); ``quantization_config`` is the producer's.
These stand in for what ModelOpt and llm-compressor write until their real files are used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

FP8_MAX = 448.0
MIDLAYER = tuple(
    f"midlayer.{p}"
    for p in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
)
FP8_DYNAMIC_IGNORE = ["lm_head", "re:.*fc.*", "re:.*embed_tokens.*"]


def quantize_layers(
    folder: Path,
    modules: tuple[str, ...],
    *,
    weights: str = "tensor",
    static_input: bool = False,
    block: tuple[int, int] = (16, 16),
    cast_maps: bool = False,
) -> None:
    """Store ``modules``' weights in FP8 with scales (``weights``: tensor, channel or block)."""
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    for module in modules:
        w = tensors[f"{module}.weight"].float()
        if weights == "channel":
            scale = w.abs().amax(dim=1, keepdim=True) / FP8_MAX
            q = w / scale
        elif weights == "block":
            bn, bk = block
            rows, cols = -(-w.shape[0] // bn), -(-w.shape[1] // bk)
            scale = torch.empty(rows, cols)
            q = torch.empty_like(w)
            for i in range(rows):
                for j in range(cols):
                    tile = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk]
                    scale[i, j] = tile.abs().amax() / FP8_MAX
                    q[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = tile / scale[i, j]
        else:
            scale = w.abs().amax() / FP8_MAX
            q = w / scale
        tensors[f"{module}.weight"] = q.to(torch.float8_e4m3fn)
        tensors[f"{module}.weight_scale"] = scale.float()
        if static_input:
            tensors[f"{module}.input_scale"] = torch.tensor(1.0)
    if cast_maps:  # what ModelOpt's quantize_drafter.py does to every tensor it writes
        tensors["d2t"] = tensors["d2t"].to(torch.bfloat16)
        tensors["t2d"] = tensors["t2d"].to(torch.bfloat16)
    save_file(tensors, str(path), metadata={"format": "pt"})


def set_quantization_config(folder: Path, qcfg: dict[str, Any]) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"] = qcfg
    path.write_text(json.dumps(config))


def fp8_args(strategy: str, dynamic: bool, **extra: Any) -> dict[str, Any]:
    return {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "strategy": strategy,
        "dynamic": dynamic,
        **extra,
    }


def compressed_tensors_config(
    ignore: list[str], weights: dict[str, Any], inputs: dict[str, Any] | None
) -> dict[str, Any]:
    """What llm-compressor's model-free PTQ writes (one group, ``targets: ["Linear"]``)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "ignore": ignore,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": inputs,
                "output_activations": None,
                "format": "float-quantized",
            }
        },
    }


def modelopt_config(ignore: list[str], algo: str = "FP8") -> dict[str, Any]:
    """ModelOpt's config.json form (vLLM reads ``ignore``)."""
    return {"quant_method": "modelopt", "quant_algo": algo, "ignore": ignore}


def fp8_dynamic_draft(folder: Path, ignore: list[str] = FP8_DYNAMIC_IGNORE) -> Path:
    """llm-compressor's FP8_DYNAMIC: per-channel weights, dynamic per-token inputs."""
    quantize_layers(folder, MIDLAYER, weights="channel")
    set_quantization_config(
        folder,
        compressed_tensors_config(ignore, fp8_args("channel", False), fp8_args("token", True)),
    )
    return folder


def modelopt_fp8_draft(folder: Path, cast_maps: bool = False) -> Path:
    """ModelOpt's quantize_drafter.py FP8: fc quantized too, static input scale 1.0."""
    quantize_layers(folder, (*MIDLAYER, "fc"), static_input=True, cast_maps=cast_maps)
    set_quantization_config(folder, modelopt_config(["*lm_head*", "*embed_tokens*"]))
    return folder
