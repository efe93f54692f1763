"""Test helper: validate's single-engine child with one deliberate fault in its draft swap.

Run as ``python -m tests.swap_mutants MUTANT SPEC OUT`` (from the repository root,
the engine core in this process). ``no-reset`` keeps the prefix cache between
drafts (the next draft reads KV blocks the previous draft wrote); ``old-weights``
leaves the previous draft's model in place. The equality test must catch both.
"""

from __future__ import annotations

import sys
from typing import Any

from eaglequant.engine.child import VLLM_PRELOAD

PRELOAD = VLLM_PRELOAD  # imported once by a fork server


def keep_prefix_cache(_llm: Any, *_args: Any, **_kwargs: Any) -> bool:
    return True


def keep_old_draft(_worker: Any, _speculative: dict[str, Any]) -> None:
    return None


def main() -> None:
    mutant = sys.argv.pop(1)
    from vllm import LLM

    from eaglequant.engine import swap
    from eaglequant.engine.child import serve_json_child
    from eaglequant.validate import single_engine

    if mutant == "no-reset":
        LLM.reset_prefix_cache = keep_prefix_cache  # type: ignore[method-assign]
    elif mutant == "old-weights":
        swap._swap = keep_old_draft
    else:
        raise SystemExit(f"unknown mutant {mutant!r}")
    serve_json_child(single_engine.run)


if __name__ == "__main__":
    main()
