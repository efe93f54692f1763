"""Test helper: an engine child run against a vLLM whose internals moved (a mutant).

Run as ``python -m tests.internals_mutants MUTANT MODULE SPEC OUT`` from the repository
root, the engine core in this process. MODULE is ``engine_run`` (validate's engine child)
or ``single_engine`` (its shared-engine child). Each mutant takes away, on the live vLLM
objects, one attribute eaglequant reads, as a vLLM release that renamed it would:
``no-kv-scale`` the draft attention's ``_k_scale_float``; ``no-draft-model`` the
proposer's ``model``; ``no-attn-names`` the proposer's ``_draft_attn_layer_names``.
What eaglequant then does (a named error, a refused swap) is the test's to judge.
"""

from __future__ import annotations

import sys
from typing import Any

from eaglequant.engine.child import VLLM_PRELOAD

PRELOAD = VLLM_PRELOAD  # imported once by a fork server


def main() -> None:
    mutant, module = sys.argv.pop(1), sys.argv.pop(1)
    from eaglequant.engine import vllm_internals as internals
    from eaglequant.engine.child import serve_json_child
    from eaglequant.validate import engine_run, single_engine

    draft_model, draft_proposer = internals.draft_model, internals.draft_proposer

    def model_without_kv_scales(worker: Any) -> Any:
        model = draft_model(worker)
        for _name, layer in internals.attention_layers(model):
            layer.__dict__.pop("_k_scale_float", None)
        return model

    def model_of_proposer_without_model(worker: Any) -> Any:
        proposer = internals.runner_of(worker).drafter  # the mutant's own reach into vLLM
        proposer.__dict__.pop("model", None)
        return draft_model(worker)

    def proposer_without_names(runner: Any) -> Any:
        runner.drafter.__dict__.pop("_draft_attn_layer_names", None)
        return draft_proposer(runner)

    if mutant == "no-kv-scale":
        internals.draft_model = model_without_kv_scales
    elif mutant == "no-draft-model":
        internals.draft_model = model_of_proposer_without_model
    elif mutant == "no-attn-names":
        internals.draft_proposer = proposer_without_names
    else:
        raise SystemExit(f"unknown mutant {mutant!r}")
    serve_json_child({"engine_run": engine_run, "single_engine": single_engine}[module].run)


if __name__ == "__main__":
    main()
