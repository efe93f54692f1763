"""Run any Python process as if on an AVX2-only CPU (no AVX-512, no native BF16).

``make test-as-avx2`` puts this folder first on ``PYTHONPATH`` with
``ATEN_CPU_CAPABILITY=avx2`` (torch's own kernels) and ``ONEDNN_MAX_CPU_ISA=AVX2``
(oneDNN's, so BF16 GEMMs are emulated as there). What those variables leave is
the CPU probe vLLM asks before it loads a kernel library: when ``torch.cpu`` is
first imported, in this process or any child, its AVX-512 and AMX probes are made
to answer no, so vLLM loads ``_C_AVX2`` as on an AVX2 EPYC. Importing torch is
not forced on processes that never use it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

PROBES = (
    "_is_avx512_supported",
    "_is_avx512_vnni_supported",
    "_is_avx512_bf16_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


def _answer_no(module: ModuleType) -> None:
    for name in PROBES:
        if hasattr(module, name):
            setattr(module, name, lambda: False)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _answer_no(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch.cpu":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())
