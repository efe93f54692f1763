"""Quark ``exclude`` lists as vLLM reads them, and the rewrite that makes them work.

vLLM (``quantization/quark/utils.py``) matches each ``exclude`` entry against
its own module names: ``re:<pattern>`` with ``re.match``, anything else by
string equality. For an EAGLE-3 draft those names are ``model.fc``,
``lm_head`` and ``model.layers.<N+i>.self_attn.qkv_proj`` (checked through its
shards ``q_proj``/``k_proj``/``v_proj``), ``…o_proj``, ``…mlp.gate_up_proj``
(shards ``gate_proj``/``up_proj``), ``…down_proj`` for draft layer i (``midlayer``
is 0, ``layers.i`` after it), with N the target's layer count. An MLA draft's
attention is named as in :mod:`eaglequant.forms.mla` (``fused_qkv_a_proj`` with
shards ``q_a_proj``/``kv_a_proj_with_mqa``, ``q_b_proj``, ``kv_b_proj``,
``o_proj``). Quark writes bare names such as ``fc``, which equal no vLLM name, so
vLLM quietly builds ``fc`` as FP8. This module predicts each layer's fate and
rewrites exclusions into regexes that vLLM matches.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from eaglequant.forms import form_of, fused_shards
from eaglequant.forms.llama import LLAMA
from eaglequant.io.model_config import DraftConfig, LayerQuantConfig, QuantizationConfig, QuantSpec
from eaglequant.recipe import MX_BLOCK, MX_DTYPES

# Bare names that the published reference card writes as these exact regexes.
CARD_REGEX = {"fc": "re:.*fc.*", "lm_head": "re:.*lm_head.*"}
# vLLM's fused module -> the checkpoint shards it is built from, over every draft form.
FUSED_SHARDS = fused_shards()
# The draft's linears outside its decoder layers, in every form (vLLM name -> checkpoint).
KEPT_OUTSIDE_LAYERS = {"model.fc": ("fc",), "lm_head": ("lm_head",)}
DEFAULT_TARGET_LAYERS = 32


def rewrite_exclude(entries: list[str]) -> list[str]:
    """Rewrite every entry as a ``re:`` pattern vLLM will match; idempotent, order kept."""
    rewritten: list[str] = []
    for entry in entries:
        pattern = _as_regex(entry)
        if pattern not in rewritten:
            rewritten.append(pattern)
    return rewritten


def _as_regex(entry: str) -> str:
    if entry.startswith("re:"):
        return entry
    if entry in CARD_REGEX:
        return CARD_REGEX[entry]
    is_glob = any(ch in entry for ch in "*?[")
    body = fnmatch.translate(entry) if is_glob else re.escape(entry) + r"$"
    # A checkpoint name ('midlayer.…') is 'model.layers.<N>.…' inside vLLM (the
    # target's layer count N is not known here: it covers that name in every draft layer).
    body = body.replace(re.escape("midlayer."), r"layers\.\d+\.")
    return f"re:(.*\\.)?{body}"


@dataclass(frozen=True)
class LayerFate:
    """How vLLM will build one draft linear: its name there and its scheme."""

    vllm_name: str
    checkpoint_names: tuple[str, ...]
    quantized: bool
    scheme: str
    reason: str
    vllm_scheme: str | None = None  # the Quark scheme class vLLM builds it with, if quantized


def vllm_linear_names(target_layers: int, draft_layers: int = 1) -> dict[str, tuple[str, ...]]:
    """vLLM module name -> the checkpoint modules it is built from, every Llama draft layer's."""
    return LLAMA.vllm_linear_names({}, target_layers, draft_layers) | KEPT_OUTSIDE_LAYERS


def draft_layer_count(config: DraftConfig) -> int:
    """The config's num_hidden_layers (1 when absent or invalid: the draft checks report it)."""
    layers = config.get("num_hidden_layers")
    return layers if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 else 1


def draft_linear_names(config: DraftConfig, target_layers: int) -> dict[str, tuple[str, ...]]:
    """:func:`vllm_linear_names` for this draft's form (an MLA draft's own attention names)."""
    form = form_of(config) or LLAMA
    layers = draft_layer_count(config)
    return form.vllm_linear_names(config, target_layers, layers) | KEPT_OUTSIDE_LAYERS


def matches(name: str, entry: str) -> bool:
    """vLLM's rule for one exclude entry."""
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    return entry == name


def is_excluded(vllm_name: str, exclude: list[str]) -> bool:
    """vLLM's ``should_ignore_layer``: a direct match, else every fused shard matches.

    Raises ValueError, as vLLM does, when only some shards of a fused layer match.
    """
    if any(matches(vllm_name, e) for e in exclude):
        return True
    proj = vllm_name.rsplit(".", 1)[-1]
    if proj not in FUSED_SHARDS:
        return False
    shard_hits = [
        any(matches(vllm_name[: -len(proj)] + shard, e) for e in exclude)
        for shard in FUSED_SHARDS[proj]
    ]
    if any(shard_hits) and not all(shard_hits):
        raise ValueError(f"exclude matches only some shards of {vllm_name}")
    return all(shard_hits)


def predict_fates(
    draft: DraftConfig, target_layers: int = DEFAULT_TARGET_LAYERS
) -> list[LayerFate]:
    """Predict vLLM's treatment of every draft linear under ``draft``'s quantization_config
    (a checkpoint's config, as vLLM reads it)."""
    qcfg = draft.get("quantization_config")
    fates = []
    for vllm_name, sources in draft_linear_names(draft, target_layers).items():
        fates.append(_fate(vllm_name, sources, qcfg))
    return fates


def _fate(vllm_name: str, sources: tuple[str, ...], qcfg: QuantizationConfig | None) -> LayerFate:
    if not isinstance(qcfg, dict):
        return LayerFate(vllm_name, sources, False, "bf16", "no quantization_config")
    if qcfg.get("quant_method") != "quark":
        method = qcfg.get("quant_method")
        return LayerFate(vllm_name, sources, False, "unknown", f"quant_method {method!r}")
    if vllm_name == "lm_head":
        return LayerFate(
            vllm_name, sources, False, "bf16", "vLLM's Quark path never quantizes lm_head"
        )
    exclude = list(qcfg.get("exclude") or [])
    try:
        excluded = is_excluded(vllm_name, exclude)
    except ValueError as exc:
        return LayerFate(vllm_name, sources, False, "error", str(exc))
    if excluded:
        return LayerFate(vllm_name, sources, False, "bf16", "excluded")
    layer_cfg = _layer_config(vllm_name, qcfg)
    return LayerFate(
        vllm_name,
        sources,
        True,
        describe_scheme(layer_cfg),
        "not excluded",
        vllm_scheme(layer_cfg),
    )


def _layer_config(vllm_name: str, qcfg: QuantizationConfig) -> LayerQuantConfig:
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
