"""The EAGLE-3 Llama form (vLLM's ``llama_eagle3.py``): the legacy and the plain-Llama config.

The first decoder layer's attention takes the token embedding and the fused target
hidden state side by side (2*hidden inputs); later layers (``layers.1.*``, …) are plain
pre-norm decoder layers. Every layer's seven linears are quantized.
"""

from __future__ import annotations

from eaglequant.forms.base import FIRST_LAYER, DraftForm, layer_linears, register
from eaglequant.io.model_config import VariantFlag

# Forward variants of vLLM's llama_eagle3.py, each implemented by the torch module.
LLAMA_VARIANTS: tuple[VariantFlag, ...] = (
    "norm_before_residual",
    "norm_output",
    "norm_before_fc",
    "fc_norm",
    "attention_bias",
)
# A plain Llama (or Qwen3) config is read as EAGLE-3 when it holds fc and the first layer.
LLAMA_MARKERS = ("fc.weight", *(f"{name}.weight" for name in layer_linears(FIRST_LAYER)))


class LlamaForm(DraftForm):
    family = "Llama"
    architectures = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
    markers = LLAMA_MARKERS
    variants = LLAMA_VARIANTS


LLAMA = register(LlamaForm())
