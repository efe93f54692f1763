"""Checks 3 and 4: the draft model vLLM built, against what ``inspect`` predicts, and its log.

3. layers: vLLM built ``fc`` and ``lm_head`` unquantized and every draft-layer
   projection with the Quark scheme ``inspect`` predicts from the draft's config
   (``QuarkW8A8Fp8``, ``QuarkOCP_MX``, ``QuarkW4A8_MXFP4_FP8``), quantized weights
   and finite positive scales, and an FP8 draft KV cache holding the checkpoint's
   calibrated K/V scales; nothing observed fails.
4. log: no "Attempted to load weight … float8_e4m3fn" (a bad exclusion); an empty
   log fails.
"""

from __future__ import annotations

import math

from eaglequant.draft import dims_from_config, kv_scale_pairs
from eaglequant.engine.result import SCALE_NAMES, DraftAttention, DraftLayer, ScaleStats
from eaglequant.exclusions import predict_fates
from eaglequant.io.checkpoint import Checkpoint
from eaglequant.recipe import E8M0_NAN
from eaglequant.validation_report import Check, CheckId

BAD_EXCLUSION_SIGNATURE = "Attempted to load weight"


def expected_schemes(draft: Checkpoint) -> dict[str, str | None]:
    """Each draft-layer linear, named within the layer (vLLM's layer index differs between its
    weights and its modules), with the Quark scheme inspect predicts vLLM builds it with
    (None: BF16, as an MLA draft's ``self_attn.kv_b_proj``)."""
    fates = predict_fates(draft.flat_config)
    return {
        f.vllm_name.split(".", 3)[3]: f.vllm_scheme if f.quantized else None
        for f in fates
        if ".layers." in f.vllm_name
    }


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
    expected: dict[str, str | None],
    kv_cache: tuple[list[DraftAttention], list[tuple[float, float]]] = ([], []),
) -> Check:
    """vLLM's draft model as built: fc, lm_head unquantized, every draft-layer linear with the
    scheme ``expected`` names for it (None: unquantized) and finite positive scales (E8M0
    exponent bytes: none NaN); with ``kv_cache`` (vLLM's draft model attention, the checkpoint's
    K/V scales), an FP8 draft KV cache holding the checkpoint's scales."""
    problems, kv_note = kv_cache_problems(*kv_cache)
    problems += unobserved(layers, expected)
    for layer in layers:
        name, method = layer["name"], layer["quant_method"]
        within = name.split(".", 3)[3] if ".layers." in name else None
        if name in ("model.fc", "lm_head", "model.embed_tokens") or (
            within is not None and expected.get(within, "QuarkW8A8Fp8") is None
        ):
            if not method.startswith("Unquantized") or layer["weight_dtype"] == "float8_e4m3fn":
                problems.append(
                    f"{name} built as {layer['scheme'] or method} ({layer['weight_dtype']})"
                )
            continue
        if within is None:
            continue
        scheme = expected.get(within, "QuarkW8A8Fp8")
        if layer["scheme"] != scheme or layer["weight_dtype"] not in QUANTIZED_WEIGHT_DTYPES:
            problems.append(
                f"{name} built as {layer['scheme'] or method} ({layer['weight_dtype']}), "
                f"expected {scheme}"
            )
        for scale in SCALE_NAMES:
            if scale in layer and not _scale_ok(layer[scale]):
                problems.append(f"{name}.{scale} not finite positive ({layer[scale]})")
    schemes = sorted({s for s in expected.values() if s is not None})
    kept = sorted(k for k, s in expected.items() if s is None)
    detail = (
        f"fc, lm_head unquantized; every draft layer's projections {'/'.join(schemes)} with "
        "finite positive scales"
    ) + (f" but for {', '.join(kept)} (BF16 as predicted)" if kept else "")
    detail += kv_note
    if problems:
        detail = "; ".join(problems)
    return Check(CheckId.LAYERS, not problems, detail, {"layers": layers, "attention": kv_cache[0]})


def unobserved(layers: list[DraftLayer], expected: dict[str, str | None]) -> list[str]:
    """What check 3 expected to see and vLLM did not report: no layer at all, a predicted
    draft-layer linear, or any scale on the quantized ones (nothing observed never passes)."""
    if not layers:
        return ["vLLM reported no draft model linear layer (nothing observed)"]
    seen = {layer["name"].split(".", 3)[3] for layer in layers if ".layers." in layer["name"]}
    missing = sorted(w for w in expected if w not in seen)
    problems = [f"vLLM reported no {', '.join(missing)} in any draft layer"] if missing else []
    quantized = [
        layer
        for layer in layers
        if ".layers." in layer["name"] and expected.get(layer["name"].split(".", 3)[3])
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
