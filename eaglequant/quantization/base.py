"""The interface every quantization method implements, and what it says of one draft linear.

A method (one module of this package each) recognises its ``quantization_config``, names
the key vLLM reads its exclusions from, and predicts for each linear of the draft, named as
vLLM builds it, the linear method, scheme and weight dtype vLLM gives it on a GPU, and why.
:mod:`eaglequant.rules.exclusions` names the draft's linears; :mod:`eaglequant.rules.inspection`
judges the fates against the tensors stored; ``fix-config`` rewrites the exclusion key; check 3
compares them with what vLLM built.

The draft's quantization config, as vLLM 0.32 builds it for an EAGLE-3 draft
(``models/utils.get_draft_quant_config``), is a fresh instance read from the draft's
``config.json`` on every call: ``apply_vllm_mapper`` is never called on it. Its fused-layer
mapping is matched here as the methods' own matching functions take it
(``qkv_proj``: ``q_proj``/``k_proj``/``v_proj``, …), the rule the conformance tests hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from eaglequant.io.model_config import QuantizationConfig

UNQUANTIZED = "UnquantizedLinearMethod"
BF16 = "bfloat16"
FP8 = "float8_e4m3fn"
# vLLM's module class for each draft linear, by its last name component (the class's name
# is what compressed-tensors matches a ``Linear`` target against).
MODULE_CLASSES = {
    "fc": "ReplicatedLinear",
    "lm_head": "ParallelLMHead",
    "qkv_proj": "QKVParallelLinear",
    "o_proj": "RowParallelLinear",
    "gate_up_proj": "MergedColumnParallelLinear",
    "down_proj": "RowParallelLinear",
    "fused_qkv_a_proj": "DeepSeekV2FusedQkvAProjLinear",
    "q_b_proj": "ColumnParallelLinear",
    "kv_b_proj": "ColumnParallelLinear",
}


def module_class(vllm_name: str) -> str:
    """The vLLM module class that builds ``vllm_name`` in an EAGLE-3 draft."""
    return MODULE_CLASSES.get(vllm_name.rsplit(".", 1)[-1], "ColumnParallelLinear")


@dataclass(frozen=True)
class LayerFate:
    """How vLLM builds one draft linear on a GPU: its name there, the checkpoint modules it is
    built from, its linear method, scheme and weight dtype, and why; ``cpu``: what the CPU
    engine runs instead, where that differs."""

    vllm_name: str
    checkpoint_names: tuple[str, ...]
    quantized: bool
    scheme: str  # a short description: "fp8 w:per_tensor a:per_tensor static", "bf16", "error"
    reason: str
    vllm_scheme: str | None = None  # the scheme class vLLM builds a quantized linear with
    linear_method: str = UNQUANTIZED
    weight_dtype: str = BF16
    static_input: bool = False  # the checkpoint must hold an input_scale for it
    block: tuple[int, int] | None = None  # the weight's (block_n, block_k), block-quantized only
    cpu: str | None = None

    @property
    def built_as(self) -> str:
        """The scheme class, else the linear method: what check 3 sees vLLM report."""
        return self.vllm_scheme or self.linear_method


class QuantMethod:
    """One ``quant_method`` vLLM serves a draft with. Subclasses set the class attributes and
    implement :meth:`fate`; the rest has defaults."""

    name: ClassVar[str]  # the quant_method value it claims
    label: ClassVar[str]  # the producer's name, for messages
    exclusion_key: ClassVar[str]  # where vLLM reads this method's exclusions

    def claims(self, qcfg: QuantizationConfig) -> bool:
        return qcfg.get("quant_method") == self.name

    def exclusion_path(self, qcfg: QuantizationConfig) -> tuple[str, ...]:
        """The keys leading to the exclusion list vLLM reads, from ``quantization_config``."""
        return (self.exclusion_key,)

    def exclusions(self, qcfg: QuantizationConfig) -> list[str]:
        """The exclusion entries vLLM reads (a non-list: none)."""
        node: Any = qcfg
        for key in self.exclusion_path(qcfg):
            node = node.get(key) if isinstance(node, dict) else None
        return [str(e) for e in node] if isinstance(node, list) else []

    def with_exclusions(self, qcfg: QuantizationConfig, entries: list[str]) -> QuantizationConfig:
        """``qcfg`` with the list vLLM reads replaced by ``entries`` (nothing else changed)."""
        path = self.exclusion_path(qcfg)
        updated: dict[str, Any] = {**qcfg}
        node = updated
        for key in path[:-1]:
            node[key] = {**node.get(key, {})}
            node = node[key]
        node[path[-1]] = entries
        return updated  # type: ignore[return-value]

    def excluded(self, vllm_name: str, entries: list[str]) -> bool:
        """Whether vLLM leaves ``vllm_name`` unquantized for ``entries`` (ValueError: vLLM
        refuses the list, in its words)."""
        raise NotImplementedError

    def fate(self, vllm_name: str, sources: tuple[str, ...], qcfg: QuantizationConfig) -> LayerFate:
        raise NotImplementedError

    def describe(self, qcfg: QuantizationConfig) -> str:
        """The config in a few words, for the inspect summary."""
        return str(self.name)

    def config_problems(self, qcfg: QuantizationConfig) -> list[tuple[str, str]]:
        """This producer's own config problems as (message, fix); none by default."""
        return []

    def matches_any(self, entry: str, names: list[str]) -> bool:
        """Whether vLLM matches ``entry`` to any of ``names`` (or to a shard of one)."""
        for name in names:
            try:
                if self.excluded(name, [entry]):
                    return True
            except ValueError:  # it matches some shards of a fused layer
                return True
        return False

    def rewrite(self, entries: list[str], names: list[str]) -> list[str]:
        """``fix-config``'s syntax repair: each entry vLLM matches to none of ``names``
        rewritten as its author meant it (:meth:`repair_entry`); order kept, no duplicates."""
        rewritten: list[str] = []
        for entry in entries:
            if not self.matches_any(entry, names):
                entry = self.repair_entry(entry, names)
            if entry not in rewritten:
                rewritten.append(entry)
        return rewritten

    def repair_entry(self, entry: str, names: list[str]) -> str:
        """``entry`` rewritten so vLLM matches what its author meant (itself: no rewrite)."""
        return entry

    def entry_for(self, vllm_name: str) -> str:
        """An entry that makes vLLM leave exactly this layer unquantized, in this method's
        syntax."""
        return vllm_name

    def bf16(self, vllm_name: str, sources: tuple[str, ...], reason: str) -> LayerFate:
        return LayerFate(vllm_name, sources, False, "bf16", reason)

    def refused(self, vllm_name: str, sources: tuple[str, ...], reason: str) -> LayerFate:
        return LayerFate(vllm_name, sources, False, "error", reason, linear_method="none")


def block_refusal(block: tuple[int, int], output_sizes: list[int], tp_size: int = 1) -> str | None:
    """vLLM's ``validate_fp8_block_shape`` (``utils/fp8_utils.py``) for a linear whose output
    is ``output_sizes`` (one per fused shard), run on ``tp_size`` ranks: its refusal, in its
    words, or None. A merged layer's last shard may be ragged; a column-parallel split must
    divide every partition."""
    block_n = block[0]
    partitions = [size // tp_size for size in output_sizes]
    split = tp_size > 1
    if not split and len(partitions) < 2:
        return None
    for size in partitions if split else partitions[:-1]:
        if size % block_n:
            return (
                f"Weight output_partition_size = {size} is not divisible by weight "
                f"quantization block_n = {block_n}."
            )
    return None
