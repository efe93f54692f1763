"""The child side of an engine process: read a JSON spec, run, write a JSON result, exit fast.

Every vLLM run (validate's engines, capture's replicas) is ``python -m <module> SPEC OUT``:
the parent writes SPEC, starts the child in its own process group
(:mod:`eaglequant.engine.process`) and reads OUT only when the child exited 0. The child
exits with ``os._exit(0)`` once OUT is on disk, skipping vLLM's slow interpreter teardown.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

# What an engine child imports before its first vLLM call: a fork server
# (:mod:`eaglequant.engine.forkserver`) imports these once, before forking each child.
VLLM_PRELOAD = ("vllm.entrypoints.llm",)
Spec = TypeVar("Spec")  # what a child's spec file holds (its parent wrote it)


def serve_json_child(run: Callable[[Spec], Mapping[str, Any]]) -> None:
    """``run`` the spec named by ``argv[1]`` (read as the child's ``Spec``) and write its
    result to ``argv[2]``."""
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    result = run(spec)
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, allow_nan=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip vLLM's slow interpreter teardown; the result is on disk
