"""What the interpreter itself costs around heavy libraries (torch, Quark, vLLM): their
imports with the cyclic garbage collector paused, and an exit without tearing them down.

Importing a large package creates hundreds of thousands of objects that live as long as the
process. The collector runs every few hundred new objects and walks them again and again,
and none of them is garbage. Paused, ``import quark.torch`` and vLLM's entry point take about a
sixth less time (``bench/import_bench.py``). Objects an import leaves unreachable are still
freed by reference counting; a cycle among them waits for the next collection.

At exit the interpreter frees every module and object one by one: seconds of one core once
torch and Quark or vLLM are loaded. A child process whose result is on disk ends at once.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import NoReturn


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


def exit_at_once(code: int = 0) -> NoReturn:
    """End this process now with ``code``, its standard streams flushed, skipping the
    interpreter's teardown and every ``atexit`` handler (for a child whose work is done)."""
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
