"""The EAGLE-3 Qwen3 form (vLLM's ``qwen3_eagle3.py``): Llama's layer plus per-head RMSNorms
on queries and keys (``q_norm``, ``k_norm``) before RoPE.

vLLM's Qwen3 draft model maps no ``midlayer.`` names, so its tensors are ``layers.0.*`` in every
format (read as ``midlayer.*`` internally). ``head_dim`` is required (vLLM would take
Qwen3Config's 128, not hidden / heads), and a sliding window is refused (vLLM would build
sliding-window layers, the module has none).
"""

from __future__ import annotations

from eaglequant.forms.base import DraftForm, FormFields, register
from eaglequant.forms.llama import LLAMA_MARKERS, LLAMA_VARIANTS
from eaglequant.io.model_config import DraftConfig


class Qwen3Form(DraftForm):
    family = "Qwen3"
    architectures = ("Eagle3Qwen3ForCausalLM",)
    markers = LLAMA_MARKERS
    variants = LLAMA_VARIANTS

    def config_problem(self, config: DraftConfig) -> tuple[str, str] | None:
        if "head_dim" not in config:
            return (
                "a Qwen3 draft without 'head_dim': vLLM takes Qwen3Config's default (128), "
                "not hidden_size / num_attention_heads",
                "add head_dim to the config",
            )
        if config.get("use_sliding_window"):
            return (
                "a Qwen3 draft with use_sliding_window: vLLM runs the layers its layer_types "
                "(or max_window_layers) name with a sliding window, which eaglequant's module "
                "does not",
                "quantize it with another tool, or drop the sliding window if it was not trained",
            )
        return None

    def dims_fields(self, config: DraftConfig, where: str) -> FormFields:
        return {"qk_norm": True}


QWEN3 = register(Qwen3Form())
