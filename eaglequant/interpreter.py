"""What the interpreter itself costs around heavy libraries (torch, Quark, vLLM): their
imports with the cyclic garbage collector paused, and an exit without tearing them down.

Importing a large package creates hundreds of thousands of objects that live as long as the
process. The collector runs every few hundred new objects and walks them again and again,
and none of them is garbage. Paused, ``import quark.torch`` and vLLM's entry point take about a
sixth less time (``bench/import_bench.py``). Resumed, the collector would walk them all again
soon after, several times (about 1 s of one core after torch and Quark): what the import
left alive is frozen first (``gc.freeze``), so no later collection looks at it again, and
a process forked afterwards does not touch those pages. Objects an import leaves unreachable
are still freed by reference counting; a cycle among them is kept. At exit they are
unfrozen, so that the interpreter's teardown frees them as usual (native extensions
report what was never freed).

At exit the interpreter frees every module and object one by one: seconds of one core once
torch and Quark or vLLM are loaded. A child process whose result is on disk ends at once.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import importlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import NoReturn


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the ``with`` block; after it every object then
    alive is frozen out of later collections, and collection resumes (also when the block
    raises), unless the caller had it off already: then the caller's block ends both."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            _freeze()
            gc.enable()


def _freeze() -> None:
    _unfreeze_at_exit()
    gc.freeze()


@functools.cache  # once per process (a fork inherits the handler with the frozen objects)
def _unfreeze_at_exit() -> None:
    atexit.register(gc.unfreeze)


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
