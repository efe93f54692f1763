"""The interface every EAGLE-3 draft form implements, with the Llama layer as its default.

A form says how to recognise a draft from its config and tensors, why vLLM (or this
tool) would not serve it, the tensors and shapes its decoder layers hold, which of their
linears Quark quantizes and which vLLM must run in BF16, and the names vLLM gives its
modules. :mod:`eaglequant.rules.draft` holds what every form shares (``fc``, ``norm``,
``lm_head``, the vocabulary maps, the variant norms) and asks the form for the rest.
A new form is one module in this package that defines a :class:`DraftForm` subclass and
:func:`register`\\ s an instance.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, TypedDict

from eaglequant.io.model_config import DraftConfig, ModelConfig, VariantFlag

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# The first decoder layer's prefix; layer i >= 1 is ``layers.i`` (vLLM maps only midlayer.).
FIRST_LAYER = "midlayer"
# vLLM's fused modules of a Llama decoder layer and the checkpoint shards they are built from.
LLAMA_FUSED_SHARDS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


class DraftDims(Protocol):
    """What a form reads of :class:`eaglequant.rules.draft.DraftDims` (the form's own dims:
    ``mla``)."""

    @property
    def hidden(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def mla(self) -> Any: ...


class FormFields(TypedDict, total=False):
    """:class:`eaglequant.rules.draft.DraftDims` fields a form sets itself (over the config's)."""

    qk_norm: bool
    norm_before_fc: bool
    attention_bias: bool


def layer_prefixes(layers: int) -> tuple[str, ...]:
    """Each decoder layer's module prefix in the EAGLE-3 layout: ``midlayer``, ``layers.1``, …"""
    return (FIRST_LAYER, *(f"layers.{i}" for i in range(1, layers)))


def layer_linears(prefix: str) -> tuple[str, ...]:
    """The seven linears of the Llama decoder layer at ``prefix``."""
    return tuple(f"{prefix}.self_attn.{p}" for p in ATTENTION_PROJECTIONS) + tuple(
        f"{prefix}.mlp.{p}" for p in MLP_PROJECTIONS
    )


def draft_linears(layers: int) -> tuple[str, ...]:
    """Every Llama decoder layer's linears, layer by layer."""
    return tuple(name for prefix in layer_prefixes(layers) for name in layer_linears(prefix))


def is_plain(config: ModelConfig) -> bool:
    """A plain (non-EAGLE-3) architecture name, which vLLM renames for method eagle3."""
    names = [str(a) for a in config.get("architectures") or []]
    return bool(names) and not any(a.startswith("Eagle3") or a.endswith("Eagle3") for a in names)


class DraftForm:
    """One draft form. Class attributes describe it; methods default to the Llama layer."""

    family = "Llama"
    # vLLM's draft model classes for this form (after its eagle3 rename of plain names).
    architectures: tuple[str, ...] = ()
    # Tensors a plain config must hold to be read as an EAGLE-3 draft of this form.
    markers: tuple[str, ...] = ()
    # Forward-variant flags of vLLM's draft model that the torch module implements for this form.
    variants: tuple[VariantFlag, ...] = ()
    # Decoder-layer linears vLLM must run unquantized (export adds them to Quark's exclude).
    kept_bf16: tuple[str, ...] = ()
    # vLLM's fused modules of this form's layer -> their checkpoint shards.
    fused_shards: ClassVar[dict[str, tuple[str, ...]]] = LLAMA_FUSED_SHARDS

    def claims(self, vllm_architectures: list[str]) -> bool:
        """Whether vLLM serves a config with these (renamed) architectures with this form."""
        return any(a in self.architectures for a in vllm_architectures)

    def recognises(self, config: DraftConfig, tensors: set[str]) -> bool:
        """An EAGLE-3 config of this form, or a plain one over this form's tensors."""
        # lazy: --help latency
        from eaglequant.io.speculators import vllm_architectures

        if not self.claims(vllm_architectures(config)):
            return False
        return not is_plain(config) or set(self.markers) <= tensors

    def config_problem(self, config: DraftConfig) -> tuple[str, str] | None:
        """Why vLLM (or this tool) would not serve this config, and the fix; or None."""
        return None

    def dims_fields(self, config: DraftConfig, where: str) -> FormFields:
        """:class:`~eaglequant.rules.draft.DraftDims` fields this form sets itself."""
        return {}

    def attention_shapes(
        self, dims: DraftDims, prefix: str, attn_in: int
    ) -> dict[str, tuple[int, ...]]:
        """The attention's tensors in the layer at ``prefix`` (``attn_in``: its input width)."""
        h, q_out, kv_out = dims.hidden, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
        return {
            f"{prefix}.self_attn.q_proj.weight": (q_out, attn_in),
            f"{prefix}.self_attn.k_proj.weight": (kv_out, attn_in),
            f"{prefix}.self_attn.v_proj.weight": (kv_out, attn_in),
            f"{prefix}.self_attn.o_proj.weight": (h, q_out),
        }

    def quantized_linears(self, dims: DraftDims) -> tuple[str, ...]:
        """Every decoder layer's linears Quark quantizes, layer by layer."""
        return tuple(n for n in draft_linears(dims.layers) if n not in self.kept_bf16)

    def vllm_linear_names(
        self, config: DraftConfig, target_layers: int, layers: int
    ) -> dict[str, tuple[str, ...]]:
        """vLLM module name -> the checkpoint modules it is built from, every draft layer's."""
        names: dict[str, tuple[str, ...]] = {}
        for i, source in enumerate(layer_prefixes(layers)):
            layer = f"model.layers.{target_layers + i}"  # vLLM's start_layer_id: after the target
            attn, mlp = f"{source}.self_attn", f"{source}.mlp"
            names |= {
                f"{layer}.self_attn.qkv_proj": tuple(
                    f"{attn}.{p}" for p in LLAMA_FUSED_SHARDS["qkv_proj"]
                ),
                f"{layer}.self_attn.o_proj": (f"{attn}.o_proj",),
                f"{layer}.mlp.gate_up_proj": tuple(
                    f"{mlp}.{p}" for p in LLAMA_FUSED_SHARDS["gate_up_proj"]
                ),
                f"{layer}.mlp.down_proj": (f"{mlp}.down_proj",),
            }
        return names


_REGISTRY: list[DraftForm] = []


def register(form: DraftForm) -> DraftForm:
    """Add a form; the most specific forms are asked first (later registrations first)."""
    _REGISTRY.insert(0, form)
    return form


def unregister(form: DraftForm) -> None:
    """Remove a registered form (for tests that add one)."""
    _REGISTRY.remove(form)


def registered() -> tuple[DraftForm, ...]:
    """Every form, in the order they are asked."""
    return tuple(_REGISTRY)
