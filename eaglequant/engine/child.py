"""The child side of an engine process: read a JSON spec, run, write a JSON result, exit fast.

Every vLLM run (validate's engines, capture's replicas) is ``python -m <module> SPEC OUT``,
started through the module's one entry point, ``CHILD = EngineChild(run)``, which the
parent imports (never the module's name as a string): the parent writes SPEC, starts the child in
its own process group (:mod:`eaglequant.engine.process`) and reads OUT only when the child exited 0.
The child exits at once (``interpreter.exit_at_once``) once OUT is on disk, skipping vLLM's slow
interpreter teardown.
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from eaglequant.interpreter import exit_at_once, import_all

# What an engine child imports before its first vLLM call: a fork server
# (:mod:`eaglequant.engine.forkserver`) imports these once, before forking each child.
VLLM_PRELOAD = ("vllm.entrypoints.llm",)
Spec = TypeVar("Spec")  # what a child's spec file holds (its parent wrote it)
Out = TypeVar("Out", bound=Mapping[str, Any])  # what it writes back


# The signals that end a process that crashed (a fault, an abort from a corrupted heap).
FATAL_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")


def die_on_fatal_signals() -> None:
    """From now on a fatal signal ends this process at once, its Python stack on stderr
    (faulthandler), whatever handler a library installed meanwhile. A crash inside vLLM then
    fails its engine with a log instead of running out the engine timeout: tvm_ffi (which
    xgrammar imports) handles faults by printing a backtrace, which calls ``calloc`` and, after
    a fault inside ``malloc``, waits forever on the heap's lock."""
    for name in FATAL_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    faulthandler.enable(all_threads=True)


def serve_json_child(run: Callable[[Spec], Mapping[str, Any]]) -> None:
    """``run`` the spec named by ``argv[1]`` (read as the child's ``Spec``) and write its
    result to ``argv[2]``. vLLM is imported first, with the garbage collector paused (a
    child forked by a fork server has it already)."""
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    import_all(VLLM_PRELOAD)
    result = run(spec)
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, allow_nan=True)
    exit_at_once()  # skip vLLM's slow interpreter teardown; the result is on disk


@dataclass(frozen=True)
class EngineChild(Generic[Spec, Out]):
    """An engine child's one typed entry point: ``run`` (its spec in, its JSON result out),
    started as ``python -m`` the module that defines it. A child module declares
    ``CHILD = EngineChild(run)`` and serves it under ``__main__``; the parent imports that
    name, so the module is named by import, never by a string."""

    run: Callable[[Spec], Out]

    @property
    def module(self) -> str:
        """The module ``python -m`` runs: the one ``run`` is defined in."""
        module: str = self.run.__module__
        if module == "__main__":
            raise RuntimeError("an engine child is started from the module that imports it")
        return module

    def argv(self, spec: str | Path, out: str | Path) -> list[str]:
        """The child's command line: this interpreter, ``-m`` its module, SPEC and OUT."""
        return [sys.executable, "-m", self.module, str(spec), str(out)]

    def serve(self) -> None:
        """The child's side (under ``__main__``): run ``argv[1]``'s spec, write ``argv[2]``."""
        serve_json_child(self.run)
