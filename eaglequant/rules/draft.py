"""What an EAGLE-3 Llama draft checkpoint must contain, checks against it, and its target's fit.

A draft is a first decoder layer (``midlayer.*``) whose attention takes the token
embedding and the fused target hidden state side by side (2*hidden inputs), then
``num_hidden_layers - 1`` plain decoder layers (``layers.1.*``, …: hidden inputs,
vLLM's ``llama_eagle3.py``), ``fc`` fusing the target's auxiliary hidden states,
``norm``, ``lm_head`` over the draft vocabulary, and optionally ``embed_tokens``
and the ``d2t``/``t2d`` vocabulary maps. Shapes follow from ``config.json``. What
differs between draft forms (the decoder layer's attention, what vLLM keeps BF16,
its names in vLLM, the form's own refusals) is the form's, :mod:`eaglequant.forms`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, cast

from eaglequant.errors import InputError
from eaglequant.forms import form_named, form_of, recognised_form
from eaglequant.forms.base import (
    FIRST_LAYER,
    DraftForm,
    is_plain,
    layer_linears,
    layer_prefixes,
)
from eaglequant.forms.llama import LLAMA
from eaglequant.forms.mla import MlaDims
from eaglequant.io import speculators
from eaglequant.io.checkpoint import Checkpoint
from eaglequant.io.model_config import DraftConfig, QuantizationConfig, VariantFlag
from eaglequant.io.safetensors_header import FLOAT_DTYPES
from eaglequant.quantization import method_of

LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")
# Built by vLLM in every layer, used by the first only: required there, optional after.
HIDDEN_NORM = "hidden_norm"
SCALE_SUFFIXES = (".weight_scale", ".input_scale")
# An FP8 KV-cache recipe's K and V scales, named as vLLM's EAGLE-3 loader reads them: Quark
# writes them as k_proj/v_proj ``.output_scale``, which that loader sends to the stacked
# qkv_proj before its cache-scale mapping ("'QKVParallelLinear' object has no attribute
# 'data'"), so the export renames them to the attention's own ``attn.k_scale``/``v_scale``.
KV_SCALES = {"k_proj": "attn.k_scale", "v_proj": "attn.v_scale"}
KV_SCALE_SUFFIXES = tuple(f".{name}" for name in KV_SCALES.values())
STORED_SCALE_SUFFIXES = SCALE_SUFFIXES + KV_SCALE_SUFFIXES  # every scale tensor an export writes


def kv_scale_name(linear: str) -> str | None:
    """Where ``linear``'s output (K or V) scale lives in the checkpoint; None: not k/v_proj."""
    parent, _, leaf = linear.rpartition(".")
    return f"{parent}.{KV_SCALES[leaf]}" if leaf in KV_SCALES else None


def kv_scale_pairs(linears: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (K, V) scale names of each attention among ``linears``, in their order."""
    k_leaf, v_leaf = KV_SCALES
    return [
        (name, f"{parent}.{KV_SCALES[v_leaf]}")
        for linear in linears
        if (name := kv_scale_name(linear)) and linear.endswith(f".{k_leaf}")
        for parent in [linear.rpartition(".")[0]]
    ]


# Must stay BF16: vLLM builds them with the draft's quantization config unless excluded.
KEEP_UNQUANTIZED = ("fc", "lm_head")


MIDLAYER_LINEARS = layer_linears(FIRST_LAYER)  # the first layer's, which every draft has
MIDLAYER_WEIGHTS = tuple(f"{name}.weight" for name in MIDLAYER_LINEARS)


@dataclass(frozen=True)
class DraftDims:
    """The dimensions of a draft, resolved from its config with vLLM's defaults."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    target_hidden: int
    num_aux: int
    vocab: int
    draft_vocab: int
    aux_layer_ids: tuple[int, ...] | None
    rms_norm_eps: float
    rope_theta: float
    norm_before_residual: bool = False  # hidden_norm's output is also the residual
    norm_output: bool = False  # the next step takes the normed, not the pre-norm, output
    norm_before_fc: bool = False  # one RMSNorm (input_norm) over fc's whole input
    fc_norm: bool = False  # one RMSNorm (fc_norm.i) per auxiliary state before fc
    attention_bias: bool = False  # q/k/v/o projections carry a bias
    qk_norm: bool = False  # Qwen3: q_norm / k_norm per head before RoPE
    layers: int = 1  # num_hidden_layers: the first layer, then plain decoder layers
    mla: MlaDims | None = None  # an MLA draft's attention (deepseek_eagle3.py)
    family: str = LLAMA.family  # the draft form's (eaglequant.forms)

    @property
    def form(self) -> DraftForm:
        return form_named(self.family)

    @property
    def fc_in(self) -> int:
        return self.num_aux * self.target_hidden

    @property
    def linears(self) -> tuple[str, ...]:
        """Every decoder layer's linears Quark quantizes (the form's: an MLA draft's all but
        kv_b_proj)."""
        return self.form.quantized_linears(self)


# The config keys read as positive integers.
IntKey = Literal[
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "intermediate_size",
    "target_hidden_size",
    "draft_vocab_size",
    "num_hidden_layers",
]


def aux_layer_ids(config: DraftConfig) -> tuple[int, ...] | None:
    """The target layers whose hidden states feed ``fc``, when the config names them."""
    eagle_config = config.get("eagle_config") or {}
    ids = config.get("eagle_aux_hidden_state_layer_ids") or eagle_config.get(
        "eagle_aux_hidden_state_layer_ids"
    )
    return tuple(int(i) for i in ids) if ids else None


def dims_from_config(config: DraftConfig, where: str = "config.json") -> DraftDims:
    """Resolve the draft's dimensions; raise InputError naming a missing or bad key."""
    hidden = _positive_int(config, "hidden_size", where)
    heads = _positive_int(config, "num_attention_heads", where)
    kv_heads = _positive_int(config, "num_key_value_heads", where, default=heads)
    head_dim = _positive_int(config, "head_dim", where, default=hidden // heads)
    vocab = _positive_int(config, "vocab_size", where)
    aux_ids = aux_layer_ids(config)
    num_aux = config.get("num_aux_hidden_states") or (len(aux_ids) if aux_ids else 3)
    rope_theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get(
        "rope_theta", 10000.0
    )
    form = form_of(config) or LLAMA
    dims = DraftDims(
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=_positive_int(config, "intermediate_size", where),
        target_hidden=_positive_int(config, "target_hidden_size", where, default=hidden),
        num_aux=int(num_aux),
        vocab=vocab,
        draft_vocab=_positive_int(config, "draft_vocab_size", where, default=vocab),
        aux_layer_ids=aux_ids,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_theta),
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        norm_output=bool(config.get("norm_output", False)),
        norm_before_fc=variant_flag(config, "norm_before_fc"),
        fc_norm=bool(config.get("fc_norm", False)),
        attention_bias=bool(config.get("attention_bias", False)),
        layers=_positive_int(config, "num_hidden_layers", where),
        family=form.family,
    )
    return replace(dims, **form.dims_fields(config, where))


def variant_flag(config: DraftConfig, key: VariantFlag) -> bool:
    """A forward-variant flag as vLLM reads it (``norm_before_fc`` also from ``eagle_config``)."""
    eagle_config = config.get("eagle_config") or {}
    return bool(eagle_config.get(key, config.get(key, False)))


def draft_form(ckpt: Checkpoint) -> str:
    """The form this tool recognised the draft as, for reports."""
    draft = form_of(ckpt.flat_config) or LLAMA
    flags = [k for k in draft.variants if variant_flag(ckpt.flat_config, k)]
    family = draft.family
    if ckpt.speculators_format:
        form = f"speculators format, EAGLE-3 {family}"
    elif is_plain(ckpt.flat_config):
        form = f"plain {family} config, EAGLE-3 tensors"
    else:
        form = f"EAGLE-3 {family}"
    layers = ckpt.flat_config.get("num_hidden_layers")
    form += f", {layers} layers" if isinstance(layers, int) and layers > 1 else ""
    return form + (f" ({', '.join(flags)})" if flags else "")


def form_exclude(exclude: tuple[str, ...], dims: DraftDims) -> tuple[str, ...]:
    """A recipe's exclude list plus the linears this draft's form keeps BF16 (MLA's kv_b_proj)."""
    kept = dims.form.kept_bf16
    return (*exclude, *(name for name in kept if name not in exclude))


def _positive_int(config: DraftConfig, key: IntKey, where: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        if key not in config and default is None:
            raise InputError(f"{where}: missing key '{key}'; add it (a positive integer)")
        raise InputError(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return value


def expected_shapes(dims: DraftDims) -> dict[str, tuple[int, ...]]:
    """Required tensor name -> shape for a BF16 draft."""
    h = dims.hidden
    shapes: dict[str, tuple[int, ...]] = {
        "norm.weight": (h,),
        f"{FIRST_LAYER}.{HIDDEN_NORM}.weight": (h,),
    }
    for i, prefix in enumerate(layer_prefixes(dims.layers)):
        shapes |= _layer_shapes(dims, prefix, 2 * h if i == 0 else h)
    shapes |= {"fc.weight": (h, dims.fc_in), "lm_head.weight": (dims.draft_vocab, h)}
    return shapes | variant_shapes(dims)


def _layer_shapes(dims: DraftDims, prefix: str, attn_in: int) -> dict[str, tuple[int, ...]]:
    """One decoder layer's norms and linears; the first layer's attention takes 2*hidden."""
    h = dims.hidden
    shapes: dict[str, tuple[int, ...]] = {f"{prefix}.{n}.weight": (h,) for n in LAYER_NORMS}
    shapes |= dims.form.attention_shapes(dims, prefix, attn_in)
    return shapes | {
        f"{prefix}.mlp.gate_proj.weight": (dims.intermediate, h),
        f"{prefix}.mlp.up_proj.weight": (dims.intermediate, h),
        f"{prefix}.mlp.down_proj.weight": (h, dims.intermediate),
    }


def variant_shapes(dims: DraftDims) -> dict[str, tuple[int, ...]]:
    """The norms and biases the forward variants add (required when their flag is on)."""
    shapes: dict[str, tuple[int, ...]] = {}
    q_out, kv_out = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    sizes = {"q_proj": q_out, "k_proj": kv_out, "v_proj": kv_out, "o_proj": dims.hidden}
    for prefix in layer_prefixes(dims.layers):  # every layer's attention, as vLLM builds it
        if dims.qk_norm:
            shapes |= {
                f"{prefix}.self_attn.{n}.weight": (dims.head_dim,) for n in ("q_norm", "k_norm")
            }
        if dims.attention_bias:  # vLLM builds o_proj's bias too (llama.py)
            shapes |= {f"{prefix}.self_attn.{p}.bias": (size,) for p, size in sizes.items()}
    if dims.norm_before_fc:
        shapes["input_norm.weight"] = (dims.fc_in,)
    if dims.fc_norm:
        shapes |= {f"fc_norm.{i}.weight": (dims.target_hidden,) for i in range(dims.num_aux)}
    return shapes


def optional_shapes(dims: DraftDims) -> dict[str, tuple[int, ...]]:
    """Optional tensor name -> shape (a later layer's ``hidden_norm``: vLLM builds it, unused)."""
    later = layer_prefixes(dims.layers)[1:]
    return {f"{p}.{HIDDEN_NORM}.weight": (dims.hidden,) for p in later} | {
        "embed_tokens.weight": (dims.vocab, dims.hidden),
        "d2t": (dims.draft_vocab,),
        "t2d": (dims.vocab,),
    }


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint, where it is, and how to fix it."""

    where: str
    message: str
    fix: str
    loadable: bool = False  # vLLM would still load the draft (validate lets vLLM show it)

    def __str__(self) -> str:
        return f"{self.where}: {self.message}; {self.fix}"


def structure_problems(ckpt: Checkpoint) -> list[Problem]:
    """Architecture, layer count, tensor names and shapes; empty when the draft is well formed."""
    config_path = str(ckpt.folder / "config.json")
    problems = _architecture_problems(ckpt, config_path)
    if problems:
        return problems
    canonical = speculators.CANONICAL_PREFIX
    stored = [info for info in ckpt.tensors.values() if info.name.startswith(canonical)]
    misnamed = stored if ckpt.layer_prefix != canonical else []
    if misnamed:
        return [
            Problem(
                f"{misnamed[0].file}: tensor '{misnamed[0].name}'",
                f"vLLM loads this draft's decoder layer as {ckpt.layer_prefix}*, not midlayer.*",
                f"rename the midlayer.* tensors to {ckpt.layer_prefix}*",
            )
        ]
    dims = dims_from_config(ckpt.flat_config, config_path)
    required, optional = expected_shapes(dims), optional_shapes(dims)
    for name, shape in required.items():
        if name not in ckpt.tensors:
            problems.append(_missing(ckpt, name, dims.layers))
            continue
        problems += _shape_problem(ckpt, name, shape)
    for name, shape in optional.items():
        if name in ckpt.tensors:
            problems += _shape_problem(ckpt, name, shape)
    if dims.draft_vocab != dims.vocab and "d2t" not in ckpt.tensors:
        problems.append(
            Problem(
                str(ckpt.folder),
                f"draft_vocab_size {dims.draft_vocab} differs from vocab_size {dims.vocab} "
                "but tensor 'd2t' is missing (vLLM would map every draft token to id 0)",
                "add the d2t map from the draft's training",
            )
        )
    problems += _unexpected_tensor_problems(ckpt, set(required) | set(optional), dims)
    return problems


def _architecture_problems(ckpt: Checkpoint, where: str) -> list[Problem]:
    stored, config = ckpt.stored_config, ckpt.flat_config
    if speculators.is_speculators(stored) and not ckpt.speculators_format:  # vLLM would refuse
        return [
            Problem(
                where,
                f"a speculators-format config vLLM would refuse: "
                f"{speculators.structure_problem(stored)}",
                "fix the config (see vllm-project/speculators' Eagle3SpeculatorConfig)",
            )
        ]
    form = recognised_form(config, set(ckpt.tensors))
    if form is None:
        return [
            Problem(
                where,
                f"architectures {config.get('architectures') or []} is not an EAGLE-3 draft",
                f"pass a draft whose architectures is {list(LLAMA.architectures[:1])} (or a "
                "Llama config over EAGLE-3 tensors: midlayer.*, fc)",
            )
        ]
    problem = form.config_problem(config)
    if problem:
        return [Problem(where, *problem)]
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        return [
            Problem(
                where,
                f"num_hidden_layers is {layers!r}: vLLM builds that many draft layers "
                "(LlamaConfig's default 32 when absent)",
                "set it to the draft's number of decoder layers (a positive integer)",
            )
        ]
    return []


def _missing(ckpt: Checkpoint, name: str, layers: int) -> Problem:
    """A required tensor is absent; a later layer's names the config's layer count."""
    stored = ckpt.stored_name(name)
    if name.startswith(FIRST_LAYER) or not name.startswith("layers."):
        return Problem(str(ckpt.folder), f"tensor '{stored}' is missing", "re-export the draft")
    return Problem(
        str(ckpt.folder),
        f"tensor '{stored}' is missing, which num_hidden_layers {layers} requires "
        "(vLLM builds that many draft layers)",
        "set num_hidden_layers to the draft's layer count, or re-export the draft",
    )


def _shape_problem(ckpt: Checkpoint, name: str, shape: tuple[int, ...]) -> list[Problem]:
    info = ckpt.tensors[name]
    # OCP MXFP4 packs two values a byte along the input dimension
    packed = info.dtype == "U8" and info.shape == (*shape[:-1], shape[-1] // 2)
    if info.shape != shape and not packed:
        return [
            Problem(
                f"{info.file}: tensor '{info.name}'",
                f"has shape {list(info.shape)}, the config implies {list(shape)}",
                "fix config.json or re-export the draft",
            )
        ]
    return []


def _unexpected_tensor_problems(
    ckpt: Checkpoint, known: set[str], dims: DraftDims
) -> list[Problem]:
    # fc and lm_head may be quantized too (ModelOpt quantizes fc): whether vLLM builds them
    # as stored is the quantization config's question (inspection), not the form's.
    linears = (*dims.linears, *KEEP_UNQUANTIZED)
    quant_parts = {f"{linear}{suffix}" for linear in linears for suffix in SCALE_SUFFIXES}
    quant_parts |= {name for linear in dims.linears if (name := kv_scale_name(linear))}
    problems = []
    for name in sorted(ckpt.tensors):
        if name in known or name in quant_parts:
            continue
        problems.append(
            Problem(
                f"{ckpt.tensors[name].file}: tensor '{ckpt.tensors[name].name}'",
                "is not part of this EAGLE-3 draft's form (vLLM would refuse to load it)",
                "remove it or check the checkpoint's origin",
            )
        )
    return problems


def refuse_quantized(ckpt: Checkpoint, role: str) -> None:
    """Raise InputError, naming the quantization method the draft declares, when ``ckpt`` is
    quantized; ``role`` says where a BF16 draft belongs (export's input, compare's baseline,
    validate's baseline)."""
    already = quantized_tensors(ckpt)
    qcfg = ckpt.flat_config.get("quantization_config")
    if already or qcfg is not None:
        raise InputError(
            f"{ckpt.folder}: already quantized ({_quantized_how(qcfg, already)}) where a BF16 "
            f"draft belongs ({role}); pass the BF16 draft it was made from — use `eaglequant "
            f"inspect {ckpt.folder}` or `eaglequant fix-config` on this one instead"
        )


def _quantized_how(qcfg: object, tensors: list[str]) -> str:
    """The quantization a draft declares (its producer and method), else its first tensor."""
    if isinstance(qcfg, dict):
        method = method_of(cast(QuantizationConfig, qcfg))
        declared = f"quant_method {qcfg.get('quant_method')!r}"
        return f"{method.label}, {declared}" if method else declared
    return f"'{tensors[0]}'"


def quantized_tensors(ckpt: Checkpoint) -> list[str]:
    """Tensors that are already quantized: FP8/integer weights or scale tensors."""
    return sorted(
        name
        for name, info in ckpt.tensors.items()
        if name.endswith(STORED_SCALE_SUFFIXES)
        or (name.endswith(".weight") and info.dtype not in FLOAT_DTYPES)
    )


def require_bf16_draft(ckpt: Checkpoint, role: str = "export's input") -> DraftDims:
    """Raise InputError unless ``ckpt`` is a well-formed, unquantized EAGLE-3 draft."""
    problems = structure_problems(ckpt)
    if problems:
        raise InputError(str(problems[0]))
    refuse_quantized(ckpt, role)
    return dims_from_config(ckpt.flat_config, str(ckpt.folder / "config.json"))
