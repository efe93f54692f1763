"""The keys of a model's ``config.json`` that eaglequant reads, typed.

A target's config (:class:`ModelConfig`), an EAGLE-3 draft's as vLLM sees it
(:class:`DraftConfig`, flat) or as a folder stores it (:class:`StoredConfig`, which may
be in the speculators format), and Quark's ``quantization_config`` inside either
(:class:`QuantizationConfig`). Every key may be absent (``total=False``); a value of
another type than declared is refused where it is read, with the file and the key.
"""

from __future__ import annotations

from typing import Literal, TypedDict

# The flags of vLLM's EAGLE-3 forward variants, read from the config (or its eagle_config).
VariantFlag = Literal[
    "norm_before_residual", "norm_output", "norm_before_fc", "fc_norm", "attention_bias"
]


class QuantSpec(TypedDict, total=False):
    """One tensor's quantization as Quark exports it (its ``QuantizationSpec``)."""

    dtype: str
    qscheme: str
    is_dynamic: bool
    symmetric: bool
    group_size: int
    scale_format: str


class LayerQuantConfig(TypedDict, total=False):
    """Quark's ``QLayerConfig``: a spec (or a list of one) per tensor of a linear."""

    weight: QuantSpec | list[QuantSpec]
    input_tensors: QuantSpec | list[QuantSpec] | None
    output_tensors: QuantSpec | list[QuantSpec] | None


class QuarkExport(TypedDict, total=False):
    """Quark's ``export`` section; vLLM calls ``len()`` on ``kv_cache_group``."""

    kv_cache_group: list[str]


class QuantizationConfig(TypedDict, total=False):
    """Quark's ``quantization_config`` as vLLM's quark method reads it."""

    quant_method: str
    version: str
    exclude: list[str]
    global_quant_config: LayerQuantConfig
    layer_quant_config: dict[str, LayerQuantConfig]
    export: QuarkExport


class ModelConfig(TypedDict, total=False):
    """Any model's config: what the target's is read for."""

    architectures: list[str]
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    max_position_embeddings: int
    text_config: ModelConfig  # a multimodal target's language model
    quantization_config: QuantizationConfig
    tie_word_embeddings: bool  # written for transformers (synthetic drafts)
    torch_dtype: str


class RopeParameters(TypedDict, total=False):
    """``rope_parameters`` (or the legacy ``rope_scaling``) as vLLM's ``get_rope`` reads it."""

    rope_theta: float
    rope_type: str
    type: str
    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float
    mscale: float
    mscale_all_dim: float | None
    attention_factor: float


class EagleConfig(TypedDict, total=False):
    """A draft config's ``eagle_config``, read before the top-level keys of the same name."""

    eagle_aux_hidden_state_layer_ids: list[int]
    norm_before_residual: bool
    norm_output: bool
    norm_before_fc: bool
    fc_norm: bool
    attention_bias: bool


class DraftConfig(ModelConfig, total=False):
    """An EAGLE-3 draft's config as vLLM sees it (a speculators config flattened)."""

    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int | None  # None: a speculators config's own absent one (vocab_size)
    target_hidden_size: int
    num_aux_hidden_states: int
    eagle_aux_hidden_state_layer_ids: list[int]
    eagle_config: EagleConfig
    rms_norm_eps: float
    rope_theta: float
    rope_parameters: RopeParameters
    rope_scaling: RopeParameters
    hidden_act: str
    use_sliding_window: bool
    norm_before_residual: bool
    norm_output: bool
    norm_before_fc: bool
    fc_norm: bool
    attention_bias: bool
    # an MLA draft's attention (DeepseekV2Config's names)
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


class ProposalMethod(TypedDict, total=False):
    proposal_type: str
    speculative_tokens: int


class Verifier(TypedDict, total=False):
    name_or_path: str
    architectures: list[str]


class SpeculatorsSection(TypedDict, total=False):
    """A speculators config's ``speculators_config``: how it proposes, what it verifies with."""

    algorithm: str
    default_proposal_method: str
    proposal_methods: list[ProposalMethod]
    verifier: Verifier


class StoredConfig(DraftConfig, total=False):
    """A draft's config as its folder stores it: flat, or in the speculators format (the
    decoder's config under ``transformer_layer_config``, the EAGLE-3 keys at the top)."""

    speculators_model_type: str
    speculators_config: SpeculatorsSection
    transformer_layer_config: DraftConfig
