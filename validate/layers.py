"""Checks 3 and 4: the draft model vLLM built, against what the draft declares and stores.

3. layers: every linear vLLM built is what the draft's own quantization config declares for it,
   by that method's rule (:mod:`eaglequant.quantization`: Quark's ``QuarkW8A8Fp8``,
   ``QuarkOCP_MX``, ``QuarkW4A8_MXFP4_FP8``, compressed-tensors' ``CompressedTensorsW8A8Fp8``,
   ModelOpt's ``ModelOptLinearMethod``, ``fp8``'s ``Fp8LinearMethod``, or unquantized), as the
   checkpoint stores it (no BF16 weight cast into an FP8 layer, the seed's pitfall: a Quark
   bare ``"fc"`` exclude), with quantized weights and finite positive scales; a producer's
   deliberate choice (ModelOpt's quantized ``fc``) is reported as a fact. eaglequant's own
   exports (those with its manifest) keep its recipe's rule: ``fc`` and ``lm_head`` BF16. An FP8
   draft KV cache holds the checkpoint's calibrated K/V scales; nothing observed fails.
4. log: no "Attempted to load weight … float8_e4m3fn" (a bad exclusion); an empty
   log fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from eaglequant.io.checkpoint import Checkpoint
from eaglequant.io.safetensors_header import FLOAT_DTYPES
from eaglequant.recipe import E8M0_NAN
from eaglequant.results.engine_result import SCALE_NAMES, DraftAttention, DraftLayer, ScaleStats
from eaglequant.results.manifest import MANIFEST_FILE
from eaglequant.results.validation_report import Check, CheckId
from eaglequant.rules.draft import dims_from_config, kv_scale_pairs
from eaglequant.rules.exclusions import predict_fates

BAD_EXCLUSION_SIGNATURE = "Attempted to load weight"
OUTSIDE_LAYERS = ("model.fc", "lm_head")


@dataclass(frozen=True)
class ExpectedLayers:
    """What check 3 expects vLLM to build: each draft-layer linear, named within the layer
    (vLLM's layer index differs between its weights and its modules), and ``model.fc`` and
    ``lm_head``, with the scheme class or linear method the draft's config declares for it
    (None: unquantized); the dtype the checkpoint stores each one's weight in (absent: not
    read); whether the draft is eaglequant's own export."""

    schemes: dict[str, str | None]
    outside: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(OUTSIDE_LAYERS))
    stored: dict[str, str] = field(default_factory=dict)
    own_export: bool = False

    def declared(self, name: str) -> tuple[bool, str | None]:
        """(judged, expected) for vLLM's module ``name``: a draft layer's linear or fc/lm_head."""
        if ".layers." in name:
            within = name.split(".", 3)[3]
            return within in self.schemes, self.schemes.get(within)
        return name in self.outside, self.outside.get(name)

    def stored_dtype(self, name: str) -> str | None:
        return self.stored.get(name.split(".", 3)[3] if ".layers." in name else name)


def expected_schemes(draft: Checkpoint) -> ExpectedLayers:
    """What the draft declares (its quantization config, read by its method's rule) and stores."""
    fates = predict_fates(draft.flat_config)
    schemes: dict[str, str | None] = {}
    outside: dict[str, str | None] = {}
    stored: dict[str, str] = {}
    for fate in fates:
        key = fate.vllm_name.split(".", 3)[3] if ".layers." in fate.vllm_name else fate.vllm_name
        built = fate.built_as if fate.quantized else None
        (schemes if ".layers." in fate.vllm_name else outside)[key] = built
        weights = [draft.tensors.get(f"{s}.weight") for s in fate.checkpoint_names]
        dtypes = [w.dtype for w in weights if w is not None]
        if dtypes and len(dtypes) == len(weights):
            stored[key] = dtypes[0]
    own = (draft.folder / MANIFEST_FILE).is_file()
    return ExpectedLayers(schemes, outside, stored, own)


def checkpoint_kv_scales(ckpt: Checkpoint) -> list[tuple[float, float]]:
    """The draft's calibrated (K, V) scales, one pair per attention in layer order (none: [])."""

    def scalar(name: str) -> float:
        return float(ckpt.load_tensor(name).float().reshape(-1)[0])

    return [
        (scalar(k), scalar(v))
        for k, v in kv_scale_pairs(dims_from_config(ckpt.flat_config).linears)
        if k in ckpt.tensors and v in ckpt.tensors
    ]


def kv_cache_problems(
    attention: list[DraftAttention], scales: list[tuple[float, float]]
) -> tuple[list[str], str]:
    """vLLM's draft model attention against the checkpoint's K/V scales: problems, and a note."""
    fp8 = [a for a in attention if a["kv_cache_dtype"].startswith("fp8")]
    if scales and not attention:  # nothing observed: the K/V scales cannot be said to be held
        return [
            f"vLLM reported no draft model attention layer for the checkpoint's {len(scales)} K/V "
            "scale pair(s)"
        ], ""
    if not scales:
        return [], " (draft KV cache FP8 with K/V scales 1.0: none calibrated)" if fp8 else ""
    if not fp8:
        dtypes = sorted({a["kv_cache_dtype"] for a in attention}) or ["unknown"]
        return [], f" (the checkpoint's K/V scales unused: draft KV cache {'/'.join(dtypes)})"
    problems = []
    if len(fp8) != len(scales):
        problems.append(f"{len(fp8)} FP8 draft attention layers for {len(scales)} K/V scale pairs")
    for layer, (k, v) in zip(fp8, scales, strict=False):
        held = (layer["k_scale"], layer["v_scale"])
        if not all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(held, (k, v), strict=True)):
            problems.append(
                f"{layer['name']} holds K/V scales {held[0]:.6g}/{held[1]:.6g}, "
                f"the checkpoint {k:.6g}/{v:.6g}"
            )
    return problems, f"; FP8 draft KV cache with the checkpoint's K/V scales ({len(scales)})"


def layers_check(
    layers: list[DraftLayer],
    expected: ExpectedLayers,
    kv_cache: tuple[list[DraftAttention], list[tuple[float, float]]] = ([], []),
) -> Check:
    """vLLM's draft model as built against what the draft declares (``expected``) and stores:
    every linear with the scheme its config gives it (None: unquantized), no BF16-stored weight
    in a quantized layer, finite positive scales (E8M0 exponent bytes: none NaN); fc and
    lm_head unquantized in eaglequant's own exports; with ``kv_cache`` (vLLM's draft model
    attention, the checkpoint's K/V scales), an FP8 draft KV cache holding the checkpoint's
    scales."""
    problems, kv_note = kv_cache_problems(*kv_cache)
    problems += unobserved(layers, expected)
    facts: dict[str, str] = {}
    for layer in layers:
        problems += _layer_problems(layer, expected, facts)
    schemes = sorted({s for s in expected.schemes.values() if s is not None})
    kept = sorted(k for k, s in expected.schemes.items() if s is None)
    detail = (
        f"{_outside_detail(facts)}; every draft layer's projections {'/'.join(schemes)} with "
        "finite positive scales"
    ) + (f" but for {', '.join(kept)} (BF16 as predicted)" if kept else "")
    detail += kv_note
    if problems:
        detail = "; ".join(problems)
    return Check(CheckId.LAYERS, not problems, detail, {"layers": layers, "attention": kv_cache[0]})


def _layer_problems(
    layer: DraftLayer, expected: ExpectedLayers, facts: dict[str, str]
) -> list[str]:
    name, method, dtype = layer["name"], layer["quant_method"], layer["weight_dtype"]
    built = layer["scheme"] or method
    if name == "model.embed_tokens":
        quantized = not method.startswith("Unquantized") or dtype == "float8_e4m3fn"
        return [f"{name} built as {built} ({dtype})"] if quantized else []
    judged, declared = expected.declared(name)
    if not judged:
        return []
    problems = []
    if declared is None:
        if not method.startswith("Unquantized") or dtype == "float8_e4m3fn":
            problems.append(f"{name} built as {built} ({dtype}), the draft declares it unquantized")
    elif built != declared or dtype not in QUANTIZED_WEIGHT_DTYPES:
        problems.append(f"{name} built as {built} ({dtype}), expected {declared}")
    stored = expected.stored_dtype(name)
    if stored is not None and (stored in FLOAT_DTYPES) == (dtype in QUANTIZED_WEIGHT_DTYPES):
        problems.append(
            f"{name} built with {dtype} weights but the checkpoint stores them as {stored}"
            + (
                ": vLLM cast the BF16 weight into a quantized layer"
                if stored in FLOAT_DTYPES
                else ""
            )
        )
    if name in OUTSIDE_LAYERS and declared is not None:
        leaf = name.removeprefix("model.")
        if expected.own_export:
            problems.append(
                f"{name} built as {built}: eaglequant's recipe keeps fc and lm_head BF16"
            )
        else:
            facts[leaf] = f"{leaf}: FP8, as declared ({built})"
    if declared is not None:
        for scale in SCALE_NAMES:
            if scale in layer and not _scale_ok(layer[scale]):
                problems.append(f"{name}.{scale} not finite positive ({layer[scale]})")
    return problems


def _outside_detail(facts: dict[str, str]) -> str:
    """fc and lm_head as built: unquantized, or quantized as the draft declares."""
    plain = [leaf for leaf in ("fc", "lm_head") if leaf not in facts]
    parts = [facts[leaf] for leaf in ("fc", "lm_head") if leaf in facts]
    if plain:
        parts.insert(0, f"{', '.join(plain)} unquantized")
    return "; ".join(parts)


def unobserved(layers: list[DraftLayer], expected: ExpectedLayers) -> list[str]:
    """What check 3 expected to see and vLLM did not report: no layer at all, a predicted
    draft-layer linear, or any scale on the quantized ones (nothing observed never passes)."""
    if not layers:
        return ["vLLM reported no draft model linear layer (nothing observed)"]
    seen = {layer["name"].split(".", 3)[3] for layer in layers if ".layers." in layer["name"]}
    missing = sorted(w for w in expected.schemes if w not in seen)
    problems = [f"vLLM reported no {', '.join(missing)} in any draft layer"] if missing else []
    quantized = [
        layer
        for layer in layers
        if ".layers." in layer["name"] and expected.schemes.get(layer["name"].split(".", 3)[3])
    ]
    if quantized and not any(scale in layer for layer in quantized for scale in SCALE_NAMES):
        problems.append(
            f"vLLM reported no weight or input scale on any of the {len(quantized)} quantized "
            "draft linears (nothing observed)"
        )
    return problems


QUANTIZED_WEIGHT_DTYPES = ("float8_e4m3fn", "uint8")  # FP8 and MXFP8; MXFP4's packed bytes


def _scale_ok(scale: ScaleStats) -> bool:
    if scale.get("dtype") == "uint8":  # E8M0 exponent bytes: 255 is NaN
        return bool(scale["max"] < E8M0_NAN)
    return bool(scale["finite_positive"])


def log_check(log: str) -> Check:
    """Check 4: the FP8 engine's log names no FP8 weight it could not load (a bad exclusion)."""
    if not log.strip():
        return Check(CheckId.ENGINE_LOG, False, "the FP8 engine wrote no log: nothing to check", {})
    hits = [
        line.strip()
        for line in log.splitlines()
        if BAD_EXCLUSION_SIGNATURE in line and "float8" in line
    ]
    detail = "no FP8 load warnings" if not hits else f"{len(hits)} warning(s): {hits[0][:300]}"
    return Check(CheckId.ENGINE_LOG, not hits, detail, {"warnings": hits[:10]})
