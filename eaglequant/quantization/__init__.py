"""Quantization methods vLLM serves an EAGLE-3 draft with, one module each.

Every module of this package defines a :class:`~eaglequant.quantization.base.QuantMethod`
as ``METHOD``; importing the package imports them all, so adding a producer's format is
adding a module. :func:`method_of` finds the one a ``quantization_config`` declares.
"""

from __future__ import annotations

import importlib
import pkgutil

from eaglequant.io.model_config import QuantizationConfig
from eaglequant.quantization.base import LayerFate, QuantMethod

METHODS: list[QuantMethod] = []
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "matching"):
        METHODS.append(importlib.import_module(f"{__name__}.{_module.name}").METHOD)


def method_of(qcfg: QuantizationConfig | None) -> QuantMethod | None:
    """The method that claims this ``quantization_config`` (None: none here does)."""
    if not isinstance(qcfg, dict):
        return None
    return next((m for m in METHODS if m.claims(qcfg)), None)


def predict(
    qcfg: QuantizationConfig | None, linears: dict[str, tuple[str, ...]]
) -> list[LayerFate]:
    """Each linear's fate (vLLM name -> its checkpoint modules) under ``qcfg``."""
    if not isinstance(qcfg, dict):
        return [
            LayerFate(n, s, False, "bf16", "no quantization_config") for n, s in linears.items()
        ]
    method = method_of(qcfg)
    if method is None:
        reason = f"quant_method {qcfg.get('quant_method')!r}: not one eaglequant predicts"
        return [
            LayerFate(n, s, False, "unknown", reason, linear_method="unknown")
            for n, s in linears.items()
        ]
    return [method.fate(n, s, qcfg) for n, s in linears.items()]


__all__ = ["METHODS", "LayerFate", "QuantMethod", "method_of", "predict"]
