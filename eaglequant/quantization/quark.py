"""AMD Quark (``quant_method: quark``), as vLLM's ``quark/quark.py`` reads a draft's config.

vLLM matches each ``exclude`` entry against its own module names (``re:<pattern>`` with
``re.match``, anything else by equality, a fused layer through its shards:
``quark/utils.should_ignore_layer``). Quark writes bare names such as ``fc``, which equal no
vLLM name, so vLLM quietly builds ``fc`` quantized: :func:`rewrite_exclude` writes them as
regexes it matches. A linear not excluded takes the first ``layer_quant_config`` pattern
naming it, else ``global_quant_config``; ``lm_head`` (a ``ParallelLMHead``, not a
``LinearBase``) is never quantized. vLLM calls ``len()`` on ``export.kv_cache_group``.
"""

from __future__ import annotations

import fnmatch
import re

from eaglequant.forms import fused_shards
from eaglequant.io.model_config import LayerQuantConfig, QuantizationConfig, QuantSpec
from eaglequant.quantization.base import FP8, LayerFate, QuantMethod
from eaglequant.quantization.matching import should_ignore_layer
from eaglequant.recipe import MX_BLOCK, MX_DTYPES

# Bare names that the published reference card writes as these exact regexes.
CARD_REGEX = {"fc": "re:.*fc.*", "lm_head": "re:.*lm_head.*"}
FUSED_SHARDS = fused_shards()
LINEAR_METHOD = "QuarkLinearMethod"


def rewrite_exclude(entries: list[str]) -> list[str]:
    """Rewrite every entry as a ``re:`` pattern vLLM will match; idempotent, order kept."""
    rewritten: list[str] = []
    for entry in entries:
        pattern = as_regex(entry)
        if pattern not in rewritten:
            rewritten.append(pattern)
    return rewritten


def as_regex(entry: str) -> str:
    """One exclusion entry (a checkpoint or vLLM name, or a shell pattern) as a ``re:`` entry
    that vLLM matches against its names (``midlayer.`` and ``model.layers.<n>.`` name every
    draft layer)."""
    if entry.startswith("re:"):
        return entry
    if entry in CARD_REGEX:
        return CARD_REGEX[entry]
    entry = re.sub(r"^model\.layers\.\d+\.", "midlayer.", entry)
    is_glob = any(ch in entry for ch in "*?[")
    body = fnmatch.translate(entry) if is_glob else re.escape(entry) + r"$"
    # A checkpoint name ('midlayer.…') is 'model.layers.<N>.…' inside vLLM (the
    # target's layer count N is not known here: it covers that name in every draft layer).
    body = body.replace(re.escape("midlayer."), r"layers\.\d+\.")
    return f"re:(.*\\.)?{body}"


def entry_for(vllm_name: str) -> str:
    """The ``re:`` entry that excludes ``vllm_name`` in every draft layer."""
    leaf = vllm_name.rsplit(".", 1)[-1]
    return CARD_REGEX.get(leaf, as_regex(vllm_name))


class Quark(QuantMethod):
    name = "quark"
    label = "AMD Quark"
    exclusion_key = "exclude"

    def excluded(self, vllm_name: str, entries: list[str]) -> bool:
        return should_ignore_layer(vllm_name, entries, FUSED_SHARDS)

    def fate(self, vllm_name: str, sources: tuple[str, ...], qcfg: QuantizationConfig) -> LayerFate:
        if vllm_name == "lm_head":
            return self.bf16(vllm_name, sources, "vLLM's Quark path never quantizes lm_head")
        try:
            if self.excluded(vllm_name, self.exclusions(qcfg)):
                return self.bf16(vllm_name, sources, "excluded")
        except ValueError as exc:
            return self.refused(vllm_name, sources, str(exc))
        layer_cfg = layer_config(vllm_name, qcfg)
        scheme = describe_scheme(layer_cfg)
        vllm = vllm_scheme(layer_cfg)
        mx = _mx_dtype(_single(layer_cfg.get("weight")) or {})
        return LayerFate(
            vllm_name,
            sources,
            True,
            scheme,
            "not excluded",
            vllm,
            LINEAR_METHOD,
            "uint8" if mx == "mxfp4" else FP8,
            static_input=scheme.endswith("static"),
            cpu=cpu_path(scheme, mx),
        )

    def describe(self, qcfg: QuantizationConfig) -> str:
        return f"quark {describe_scheme({**(qcfg.get('global_quant_config') or {})})}"

    def config_problems(self, qcfg: QuantizationConfig) -> list[tuple[str, str]]:
        export = qcfg.get("export")
        if not isinstance(export, dict) or not isinstance(export.get("kv_cache_group"), list):
            return [
                (
                    "quantization_config.export.kv_cache_group must be a list (vLLM calls len() "
                    "on it)",
                    'set "export": {"kv_cache_group": [], ...}',
                )
            ]
        return []

    def rewrite(self, entries: list[str], names: list[str]) -> list[str]:
        return rewrite_exclude(entries)

    def entry_for(self, vllm_name: str) -> str:
        return entry_for(vllm_name)


def cpu_path(scheme: str, mx: str | None) -> str:
    """What vLLM's CPU engine runs for this scheme here, with eaglequant's CPU plugin loaded."""
    if mx is not None:
        return "vLLM's MX emulation on dequantized weights, with eaglequant's CPU MX kernels"
    if scheme == "fp8 w:per_tensor a:per_tensor static":
        return (
            "eaglequant's FP8 kernel on AVX512-BF16 CPUs, else vLLM's CPU FP8 GEMM over inputs "
            "quantized by eaglequant's plugin"
        )
    return "vLLM's CPU FP8 GEMM over inputs quantized by eaglequant's plugin (torch-native)"


def layer_config(vllm_name: str, qcfg: QuantizationConfig) -> LayerQuantConfig:
    """vLLM's lookup: a ``layer_quant_config`` pattern, else ``global_quant_config``."""
    layer_cfgs = qcfg.get("layer_quant_config") or {}
    proj = vllm_name.rsplit(".", 1)[-1]
    names = [vllm_name[: -len(proj)] + s for s in FUSED_SHARDS.get(proj, (proj,))]
    for pattern, cfg in layer_cfgs.items():
        hit = any(fnmatch.fnmatch(n, pattern) if "*" in pattern else n in pattern for n in names)
        if hit:
            return {**cfg}
    return {**(qcfg.get("global_quant_config") or {})}


def describe_scheme(layer_cfg: LayerQuantConfig) -> str:
    """A short name such as ``fp8 w:per_tensor a:per_tensor static`` or ``mxfp4 a:mxfp4``."""
    weight = _single(layer_cfg.get("weight"))
    act = _single(layer_cfg.get("input_tensors"))
    if not weight:
        return "bf16 (no weight spec)"
    mx = _mx_dtype(weight)
    if mx is not None:
        if not act:
            return f"{mx} weight-only"
        a_mx = _mx_dtype(act)
        if a_mx is not None:
            return f"{mx} a:{a_mx} dynamic"
        mode = "dynamic" if act.get("is_dynamic") else "static"
        return f"{mx} a:fp8 {act.get('qscheme')} {mode}"
    if weight.get("dtype") != "fp8_e4m3":
        return f"{weight.get('dtype')} (not FP8 E4M3)"
    w = weight.get("qscheme")
    if not act:
        return f"fp8 w:{w} weight-only"
    a = act.get("qscheme")
    if act.get("is_dynamic"):
        a = "per_token" if a == "per_channel" else a
        return f"fp8 w:{w} a:{a} dynamic"
    return f"fp8 w:{w} a:{a} static"


def vllm_scheme(layer_cfg: LayerQuantConfig) -> str | None:
    """The Quark scheme class vLLM builds a quantized linear with (its dispatch order), or None.

    ``QuarkW8A8Fp8`` for FP8 per-tensor/per-channel weights, ``QuarkW4A8_MXFP4_FP8``
    for MXFP4 weights with static per-tensor FP8 inputs, ``QuarkOCP_MX`` for other
    OCP MX weights.
    """
    weight = _single(layer_cfg.get("weight"))
    act = _single(layer_cfg.get("input_tensors"))
    if not weight:
        return None
    if weight.get("dtype") == "fp8_e4m3" and weight.get("qscheme") in ("per_tensor", "per_channel"):
        return "QuarkW8A8Fp8" if act and act.get("dtype") == "fp8_e4m3" else None
    mx = _mx_dtype(weight)
    if mx is None:
        return None
    if act and act.get("dtype") == "fp8_e4m3" and not act.get("is_dynamic"):
        w4a8 = mx == "mxfp4" and act.get("qscheme") == "per_tensor" and act.get("symmetric")
        return "QuarkW4A8_MXFP4_FP8" if w4a8 else None
    return "QuarkOCP_MX"


def _mx_dtype(spec: QuantSpec) -> str | None:
    """``mxfp8_e4m3`` or ``mxfp4`` for an OCP MX spec (per_group of 32, E8M0 scales)."""
    dtype = str(spec.get("dtype"))
    mx = dtype.replace("fp", "mxfp", 1)
    grouped = spec.get("qscheme") == "per_group" and spec.get("group_size") == MX_BLOCK
    if mx in MX_DTYPES and grouped and spec.get("scale_format") == "e8m0":
        return mx
    return None


def _single(spec: QuantSpec | list[QuantSpec] | None) -> QuantSpec | None:
    if isinstance(spec, list):
        return spec[0] if len(spec) == 1 else None
    return spec if isinstance(spec, dict) else None


METHOD = Quark()
