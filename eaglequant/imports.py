"""Heavy imports (torch, Quark, vLLM) with Python's cyclic garbage collector paused.

Importing a large package creates hundreds of thousands of objects that live as long as the
process. The collector runs every few hundred new objects and walks them again and again,
and none of them is garbage. Paused, ``import quark.torch`` and vLLM's entry point take about a
sixth less time (``bench/import_bench.py``). Objects an import leaves unreachable are still
freed by reference counting; a cycle among them waits for the next collection.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the ``with`` block (it resumes after, also when
    the block raises, unless the caller had it off already)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def import_all(names: Iterable[str]) -> None:
    """Import each module of ``names`` with the collector paused."""
    with collection_paused():
        for name in names:
            importlib.import_module(name)
