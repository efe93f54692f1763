"""vLLM's own FP8 checkpoint format (``quant_method: fp8``), as its ``fp8.py`` reads a draft.

``ignored_layers`` (or, when that is empty, ``modules_to_not_convert``) lists vLLM module
names matched exactly, a fused layer through its shards (``is_layer_skipped``, exact mode):
no regex, no pattern, so a bare ``fc`` leaves ``model.fc`` quantized. Every other linear is
an ``Fp8LinearMethod`` with per-tensor weights (``weight_block_size``: blocks, scales in
``weight_scale_inv``) and static or dynamic per-tensor inputs (``activation_scheme``);
``lm_head`` is never quantized.
"""

from __future__ import annotations

from typing import Any

from eaglequant.forms import fused_shards
from eaglequant.io.model_config import QuantizationConfig
from eaglequant.quantization.base import FP8, LayerFate, QuantMethod
from eaglequant.quantization.matching import is_layer_skipped

FUSED_SHARDS = fused_shards()
LINEAR_METHOD = "Fp8LinearMethod"


class Fp8(QuantMethod):
    name = "fp8"
    label = "vLLM fp8"
    exclusion_key = "ignored_layers"

    def exclusion_path(self, qcfg: QuantizationConfig) -> tuple[str, ...]:
        raw: Any = qcfg
        if not raw.get("ignored_layers") and "modules_to_not_convert" in raw:
            return ("modules_to_not_convert",)
        return ("ignored_layers",)

    def excluded(self, vllm_name: str, entries: list[str]) -> bool:
        return is_layer_skipped(vllm_name, entries, FUSED_SHARDS)

    def fate(self, vllm_name: str, sources: tuple[str, ...], qcfg: QuantizationConfig) -> LayerFate:
        refusal = self._refusal(qcfg)
        if refusal:
            return self.refused(vllm_name, sources, refusal)
        if vllm_name == "lm_head":
            return self.bf16(vllm_name, sources, "vLLM's fp8 path never quantizes lm_head")
        key = self.exclusion_path(qcfg)[0]
        try:
            if self.excluded(vllm_name, self.exclusions(qcfg)):
                return self.bf16(vllm_name, sources, f"listed in {key}")
        except ValueError as exc:
            return self.refused(vllm_name, sources, str(exc))
        raw: Any = qcfg
        static = raw.get("activation_scheme") == "static"
        block = _block(qcfg)
        weights = f"block {block[0]}x{block[1]}" if block else "per_tensor"
        mode = "a:per_tensor static" if static else "a:dynamic"
        return LayerFate(
            vllm_name,
            sources,
            True,
            f"fp8 w:{weights} {mode}",
            f"not listed in {key}",
            None,
            LINEAR_METHOD,
            FP8,
            static_input=static,
            block=block,
        )

    def describe(self, qcfg: QuantizationConfig) -> str:
        raw: Any = qcfg
        return f"fp8 activation_scheme {raw.get('activation_scheme')}"

    def config_problems(self, qcfg: QuantizationConfig) -> list[tuple[str, str]]:
        refusal = self._refusal(qcfg)
        return [(refusal, "re-export the draft")] if refusal else []

    def repair_entry(self, entry: str, names: list[str]) -> str:
        """A bare name ('fc', 'midlayer.mlp.down_proj') as the one vLLM name that ends with it."""
        leaf = entry.removeprefix("midlayer.")
        hits = [n for n in names if n == leaf or n.endswith("." + leaf)]
        return hits[0] if len(hits) == 1 else entry

    @staticmethod
    def _refusal(qcfg: QuantizationConfig) -> str | None:
        raw: Any = qcfg
        scheme = raw.get("activation_scheme")
        if scheme not in ("static", "dynamic"):
            return f"vLLM refuses it: Unsupported activation scheme {scheme}"
        block = raw.get("weight_block_size")
        if block is not None and (not isinstance(block, list) or len(block) != 2):
            size = len(block) if isinstance(block, list) else block
            return (
                "vLLM refuses it: The quantization block size of weight must have 2 "
                f"dimensions, but got {size} dimensions"
            )
        if block is not None and scheme != "dynamic":
            return (
                "vLLM refuses it: The block-wise quantization only supports dynamic activation "
                f"scheme for now, but got {scheme} activation scheme."
            )
        return None


def _block(qcfg: QuantizationConfig) -> tuple[int, int] | None:
    raw: Any = qcfg
    block = raw.get("weight_block_size")
    return (int(block[0]), int(block[1])) if isinstance(block, list) and len(block) == 2 else None


METHOD = Fp8()
