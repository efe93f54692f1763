"""Test helper: run vLLM speculative decoding once and record what its EAGLE-3 drafter computed.

Run as ``python -m tests.draft_recorder SPEC OUT`` (from the repository root). SPEC
is a JSON file with the target, the draft, one prompt and k. The engine runs in
float32 (the draft inherits the target's dtype), so vLLM's drafter and the
project's module can be compared to float32 rounding. A worker extension hooks
the drafter: the auxiliary states its proposer combines (the input of
``combine_hidden_states``: before any fc-input norm and ``fc``) and, for each of
the first ``calls`` drafter forwards, its ``input_ids``, ``positions``, the
fused hidden states it took, and what it returned (the normed output and the
state the next step takes). OUT is a safetensors file of those tensors.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from eaglequant.engine import vllm_internals
from eaglequant.engine.child import VLLM_PRELOAD

CALLS = 2
PRELOAD = VLLM_PRELOAD  # imported once by a fork server


class DraftRecorder:
    """Worker extension: records the drafter's inputs and outputs (``collective_rpc`` by name)."""

    def eaglequant_record(self, calls: int) -> None:
        drafter = vllm_internals.draft_model(self)
        records: dict[str, Any] = {}
        self._eaglequant_records = records

        combine = drafter.combine_hidden_states

        def on_combine(hidden_states: Any) -> Any:  # before input_norm / fc_norm, then fc
            if "fc_input.0" not in records:
                records["fc_input.0"] = hidden_states.detach().float().cpu().clone()
            return combine(hidden_states)

        def on_model(_module: Any, _args: Any, kwargs: dict[str, Any], output: Any) -> None:
            call = sum(1 for k in records if k.endswith(".input_ids"))
            if call >= calls:
                return
            last, state = output
            for key in ("input_ids", "positions", "hidden_states"):
                records[f"call{call}.{key}"] = kwargs[key].detach().cpu().clone()
            records[f"call{call}.last"] = last.detach().float().cpu().clone()
            records[f"call{call}.state"] = state.detach().float().cpu().clone()

        drafter.combine_hidden_states = on_combine
        drafter.register_forward_hook(on_model, with_kwargs=True)

    def eaglequant_records(self) -> dict[str, Any]:
        """As nested lists: what collective_rpc carries across processes unchanged."""
        return {k: v.tolist() for k, v in self._eaglequant_records.items()}


def main() -> None:
    import torch
    from safetensors.torch import save_file
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    from eaglequant.engine.config import platform_defaults, platform_env, usable_cores
    from eaglequant.rules.speculative import speculative_config

    with open(sys.argv[1], encoding="utf-8") as handle:
        spec = json.load(handle)
    on_cpu = current_platform.is_cpu()
    os.environ.update(platform_env(os.environ, on_cpu, 1, usable_cores()))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # one process: no engine core outlives it
    kwargs = platform_defaults(
        {
            "model": spec["target"],
            "speculative_config": speculative_config(
                spec["draft"], spec["k"], attention_backend=spec.get("attention_backend")
            ),
            "dtype": "float32",
            "max_model_len": 512,
            "seed": 0,
        }
        | ({"attention_backend": spec["attention_backend"]} if "attention_backend" in spec else {}),
        on_cpu,
    )
    llm = LLM(**kwargs, worker_extension_cls="tests.draft_recorder.DraftRecorder")
    llm.collective_rpc("eaglequant_record", args=(CALLS,))
    params = SamplingParams(temperature=0.0, max_tokens=spec["k"] + 2, ignore_eos=True)
    llm.generate([spec["prompt"]], params, use_tqdm=False)
    records = llm.collective_rpc("eaglequant_records")[0]
    save_file({k: torch.as_tensor(v).contiguous() for k, v in records.items()}, sys.argv[2])
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
