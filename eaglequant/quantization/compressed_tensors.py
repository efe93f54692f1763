"""compressed-tensors (``quant_method: compressed-tensors``, what llm-compressor writes), as
vLLM's ``compressed_tensors/compressed_tensors.py`` reads a draft's config.

A linear in ``ignore`` (exact name or ``re:`` regex, a fused layer through every shard:
``should_ignore_layer``) is unquantized. Otherwise the first target of the
``config_groups`` that matches it (its name, every shard's name, or, as a case-blind
substring, the class name of the vLLM module: ``"Linear"`` names every linear but the
``ParallelLMHead``: ``find_matched_target``) gives its weight and input arguments. Float
8-bit weights (static, symmetric, per tensor, channel or 128-style block) with float inputs
that are dynamic, or static symmetric per tensor, are ``CompressedTensorsW8A8Fp8`` (on a GPU
of compute capability 8.9 or more; below it ``CompressedTensorsW8A16Fp8``); other inputs
leave ``CompressedTensorsW8A16Fp8``. Config groups of one ``…Attention`` target are dropped,
as vLLM drops them.

The config is parsed by hand: compressed-tensors' own ``QuantizationConfig`` is pydantic
over torch, which the torch-free core (``inspect`` reads headers only) cannot import. The
integration tests hold this reading to that library's and to vLLM's matching functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eaglequant.forms import fused_shards
from eaglequant.io.model_config import QuantizationConfig
from eaglequant.quantization.base import FP8, LayerFate, QuantMethod, module_class
from eaglequant.quantization.matching import find_matched_target, should_ignore_layer
from eaglequant.quantization.quark import as_regex
from eaglequant.quantization.quark import entry_for as regex_entry_for

FUSED_SHARDS = fused_shards()
LINEAR_METHOD = "CompressedTensorsLinearMethod"
# compressed-tensors' formats whose activations are quantized (vLLM's
# ``is_activation_quantization_format``).
ACTIVATION_FORMATS = ("naive-quantized", "int-quantized", "float-quantized", "nvfp4-pack-quantized")
FP8_STRATEGIES = ("tensor", "channel", "block")


@dataclass(frozen=True)
class Args:
    """One tensor's ``QuantizationArgs`` as the config writes them (the fields vLLM reads)."""

    num_bits: int
    type: str
    symmetric: bool
    strategy: str
    dynamic: bool | str
    block: tuple[int, int] | None

    @classmethod
    def read(cls, raw: Any) -> Args | None:
        if not isinstance(raw, dict):
            return None
        block = raw.get("block_structure")
        return cls(
            num_bits=int(raw.get("num_bits", 8)),
            type=str(raw.get("type", "int")),
            symmetric=bool(raw.get("symmetric", True)),
            strategy=str(raw.get("strategy") or "tensor"),
            dynamic=raw.get("dynamic", False),
            block=(int(block[0]), int(block[1]))
            if isinstance(block, list) and len(block) == 2
            else None,
        )

    def describe(self) -> str:
        if self.block:
            return f"block {self.block[0]}x{self.block[1]}"
        return self.strategy


@dataclass(frozen=True)
class Group:
    """What one target of a config group applies: weights, inputs, format."""

    weights: Args | None
    inputs: Args | None
    format: str | None


def target_scheme_map(qcfg: QuantizationConfig) -> dict[str, Group]:
    """vLLM's ``target_scheme_map``: target -> its group (a later group's wins, in the first
    one's place), attention-only groups dropped."""
    raw: Any = qcfg
    groups = raw.get("config_groups") or {}
    found: dict[str, Group] = {}
    for group in groups.values() if isinstance(groups, dict) else []:
        if not isinstance(group, dict):
            continue
        targets = [str(t) for t in group.get("targets") or []]
        if len(targets) == 1 and targets[0].endswith("Attention"):
            continue
        parsed = Group(
            Args.read(group.get("weights")),
            Args.read(group.get("input_activations")),
            group.get("format"),
        )
        for target in targets:
            found[target] = parsed
    return found


class CompressedTensors(QuantMethod):
    name = "compressed-tensors"
    label = "llm-compressor (compressed-tensors)"
    exclusion_key = "ignore"

    def excluded(self, vllm_name: str, entries: list[str]) -> bool:
        return should_ignore_layer(vllm_name, entries, FUSED_SHARDS)

    def fate(self, vllm_name: str, sources: tuple[str, ...], qcfg: QuantizationConfig) -> LayerFate:
        try:
            if self.excluded(vllm_name, self.exclusions(qcfg)):
                return self.bf16(vllm_name, sources, "matched by ignore")
        except ValueError as exc:
            return self.refused(vllm_name, sources, str(exc))
        schemes = target_scheme_map(qcfg)
        target = find_matched_target(vllm_name, module_class(vllm_name), schemes, FUSED_SHARDS)
        if target is None:
            return self.bf16(vllm_name, sources, "no config_groups target matches it")
        group = schemes[target]
        if group.weights is None:
            return self.bf16(vllm_name, sources, f"target {target!r} quantizes no weights")
        return self._scheme(vllm_name, sources, target, group, qcfg)

    def _scheme(
        self,
        vllm_name: str,
        sources: tuple[str, ...],
        target: str,
        group: Group,
        qcfg: QuantizationConfig,
    ) -> LayerFate:
        raw: Any = qcfg
        fmt = group.format or raw.get("format")
        w, a = group.weights, group.inputs
        assert w is not None
        fp8_weight = (
            w.type == "float"
            and w.num_bits == 8
            and w.symmetric
            and not w.dynamic
            and w.strategy in FP8_STRATEGIES
        )
        why = f"target {target!r}"
        if not fp8_weight or fmt not in ACTIVATION_FORMATS:
            return self.refused(
                vllm_name,
                sources,
                f"{why}: a compressed-tensors scheme eaglequant does not predict (weights "
                f"{w.type} {w.num_bits}-bit {w.describe()}, format {fmt})",
            )
        block = w.block if w.strategy == "block" else None
        weights = f"fp8 w:{w.describe()}"
        if (
            a is not None
            and a.type == "float"
            and (a.dynamic or (a.symmetric and a.strategy == "tensor"))
        ):
            mode = "dynamic" if a.dynamic else "static"
            return LayerFate(
                vllm_name,
                sources,
                True,
                f"{weights} a:{a.describe()} {mode}",
                f"{why} (CompressedTensorsW8A16Fp8 below compute capability 8.9)",
                "CompressedTensorsW8A8Fp8",
                LINEAR_METHOD,
                FP8,
                static_input=not a.dynamic,
                block=block,
            )
        inputs = "none" if a is None else f"{a.type} {a.describe()} (not W8A8 FP8)"
        return LayerFate(
            vllm_name,
            sources,
            True,
            f"{weights} weight-only",
            f"{why}; inputs {inputs}: BF16 activations",
            "CompressedTensorsW8A16Fp8",
            LINEAR_METHOD,
            FP8,
            block=block,
        )

    def describe(self, qcfg: QuantizationConfig) -> str:
        raw: Any = qcfg
        return f"compressed-tensors {raw.get('format') or '(no format)'}"

    def repair_entry(self, entry: str, names: list[str]) -> str:
        pattern = as_regex(entry)
        return pattern if self.matches_any(pattern, names) else entry

    def entry_for(self, vllm_name: str) -> str:
        return regex_entry_for(vllm_name)


METHOD = CompressedTensors()
