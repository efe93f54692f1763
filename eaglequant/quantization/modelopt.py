"""NVIDIA ModelOpt FP8 (``quant_method: modelopt``), as vLLM's ``modelopt.py`` reads a draft.

vLLM reads the algorithm and the exclusions from ``quantization.quant_algo`` and
``quantization.exclude_modules`` when the config has a ``quantization`` section (the
``hf_quant_config.json`` layout), else from ``quant_algo`` and ``ignore`` at the top level.
An entry excludes a layer by exact name (a fused layer through its shards), by substring,
or as an ``fnmatch`` pattern (``is_layer_excluded``): a bare ``fc`` does exclude
``model.fc`` here. Unlike Quark and ``fp8``, ModelOpt quantizes the ``ParallelLMHead`` too
unless it is excluded. ``FP8`` is per-tensor weights with a static per-tensor input scale,
``FP8_PER_CHANNEL_PER_TOKEN`` per-channel weights with dynamic per-token inputs,
``FP8_PB_WO`` 128x128 weight blocks with dynamic per-block inputs (its format pads widths
that are not a multiple of 128: no block refusal); every one is a ``ModelOptLinearMethod``.
"""

from __future__ import annotations

from typing import Any

from eaglequant.forms import fused_shards
from eaglequant.io.model_config import QuantizationConfig
from eaglequant.quantization.base import FP8, LayerFate, QuantMethod
from eaglequant.quantization.matching import modelopt_excluded

FUSED_SHARDS = fused_shards()
LINEAR_METHOD = "ModelOptLinearMethod"
# quant_algo -> (scheme description, static input scale needed); vLLM's LINEAR_ALGOS of the
# "modelopt" config (``algos_owned_by("modelopt")``), in its order.
ALGOS = {
    "FP8": ("fp8 w:per_tensor a:per_tensor static", True),
    "FP8_PER_CHANNEL_PER_TOKEN": ("fp8 w:per_channel a:per_token dynamic", False),
    "FP8_PB_WO": ("fp8 w:block 128x128 a:per_block dynamic", False),
}
# vLLM's other ModelOpt algorithms (its QUANT_ALGOS, in order), served by the modelopt_fp4,
# modelopt_mxfp8 and modelopt_mixed configs.
OTHER_CONFIGS_ALGOS = ("NVFP4", "W4A16_NVFP4", "MXFP8", "MIXED_PRECISION")
VLLM_QUANT_ALGOS = [*ALGOS, *OTHER_CONFIGS_ALGOS]


def quant_algo(qcfg: QuantizationConfig) -> str:
    """The algorithm as vLLM reads it (upper-cased; '' when absent)."""
    raw: Any = qcfg
    section = raw.get("quantization")
    source = section if isinstance(section, dict) else raw
    return str(source.get("quant_algo") or "").upper()


class ModelOpt(QuantMethod):
    name = "modelopt"
    label = "NVIDIA ModelOpt"
    exclusion_key = "ignore"

    def exclusion_path(self, qcfg: QuantizationConfig) -> tuple[str, ...]:
        return ("quantization", "exclude_modules") if "quantization" in qcfg else ("ignore",)

    def excluded(self, vllm_name: str, entries: list[str]) -> bool:
        return modelopt_excluded(vllm_name, entries, FUSED_SHARDS)

    def fate(self, vllm_name: str, sources: tuple[str, ...], qcfg: QuantizationConfig) -> LayerFate:
        refusal = self._algo_refusal(qcfg)
        if refusal:
            return self.refused(vllm_name, sources, refusal)
        key = ".".join(self.exclusion_path(qcfg))
        try:
            if self.excluded(vllm_name, self.exclusions(qcfg)):
                return self.bf16(vllm_name, sources, f"matched by {key}")
        except ValueError as exc:
            return self.refused(vllm_name, sources, str(exc))
        algo = quant_algo(qcfg)
        scheme, static = ALGOS[algo]
        return LayerFate(
            vllm_name,
            sources,
            True,
            scheme,
            f"quant_algo {algo}, not matched by {key}",
            None,
            LINEAR_METHOD,
            FP8,
            static_input=static,
        )

    def describe(self, qcfg: QuantizationConfig) -> str:
        return f"modelopt {quant_algo(qcfg) or '(no quant_algo)'}"

    def config_problems(self, qcfg: QuantizationConfig) -> list[tuple[str, str]]:
        refusal = self._algo_refusal(qcfg)
        return [(refusal, "re-export with --qformat fp8")] if refusal else []

    def repair_entry(self, entry: str, names: list[str]) -> str:
        return entry  # substring and fnmatch: a name vLLM misses is not a naming slip

    def entry_for(self, vllm_name: str) -> str:
        if vllm_name.startswith("model.layers."):  # every draft layer's, whatever N is
            return "*." + vllm_name.split(".", 3)[3]
        return vllm_name

    @staticmethod
    def _algo_refusal(qcfg: QuantizationConfig) -> str | None:
        algo = quant_algo(qcfg)
        if not algo:
            return "vLLM refuses it: Missing 'quant_algo' in quantization config"
        if algo in OTHER_CONFIGS_ALGOS:
            return (
                f"quant_algo {algo} is served by another of vLLM's ModelOpt configs, whose "
                "layers eaglequant does not predict"
            )
        if algo not in ALGOS:
            return (
                f"vLLM refuses it: ModelOpt currently only supports: {VLLM_QUANT_ALGOS} "
                "quantizations in vLLM. Please check the `hf_quant_config.json` file for your "
                "model's quant configuration."
            )
        return None


METHOD = ModelOpt()
