"""One vLLM capture replica in its own process (``python -m eaglequant.capture.vllm_child``).

Its argv is SPEC OUT. SPEC is a JSON file: ``llm`` (``vllm.LLM`` keyword arguments for the target,
its parallelism and the user's engine arguments), ``aux_layer_ids``, the
capture ``file`` to fill, this replica's ``rows`` [first, end), a ``scratch``
folder for the engine's own files and ``chunk`` (requests per batch); OUT is where
this run's record goes (:mod:`eaglequant.engine.child`).

The target runs with vLLM's speculative method ``extract_hidden_states``: the
model returns the auxiliary layers' states, a cache-only layer stores them in
the KV cache, and the KV connector writes one safetensors file per finished
request (``hidden_states`` [T, num_aux, hidden], ``token_ids`` [T]). Each file
is read (under the connector's lock), its token ids checked against the row,
written in place into the capture file and removed, one chunk of requests at a
time, so neither memory nor scratch space grows with the number of sequences.
On CPU the connector is :mod:`eaglequant.capture.cpu_connector`; elsewhere
vLLM's own ``ExampleHiddenStatesConnector``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from eaglequant.capture.records import ReplicaResult, ReplicaSpec
from eaglequant.capture.store import CaptureFile
from eaglequant.engine.child import VLLM_PRELOAD, EngineChild, die_on_fatal_signals
from eaglequant.engine.config import platform_defaults
from eaglequant.engine.introspection import (
    engine_record,
    loaded_kernel_libraries,
    tree_peak_rss_mib,
)

if TYPE_CHECKING:  # Python 3.11's; annotations stay strings at run time (3.10 too)
    from typing import NotRequired

PRELOAD = VLLM_PRELOAD  # imported once by a fork server
CPU_CONNECTOR = ("CpuHiddenStatesConnector", "eaglequant.capture.cpu_connector")
STOCK_CONNECTOR = "ExampleHiddenStatesConnector"


class KvTransferConfig(TypedDict):
    """vLLM's ``kv_transfer_config``: the connector that writes each request's states."""

    kv_connector: str
    kv_role: str
    kv_connector_extra_config: dict[str, str]
    kv_connector_module_path: NotRequired[str]


class ExtractorConfig(TypedDict):
    """vLLM's ``speculative_config`` that extracts the auxiliary layers' states."""

    method: str
    num_speculative_tokens: int
    draft_model_config: dict[str, dict[str, list[int]]]


class CaptureKwargs(TypedDict):
    """The ``vllm.LLM`` arguments capture adds to the engine's."""

    speculative_config: ExtractorConfig
    kv_transfer_config: KvTransferConfig
    enable_chunked_prefill: bool


def capture_kwargs(aux_ids: list[int], storage: str, on_cpu: bool) -> CaptureKwargs:
    """The ``vllm.LLM`` arguments that turn the target into a hidden-state extractor."""
    connector: KvTransferConfig = {
        "kv_connector": STOCK_CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": storage},
    }
    if on_cpu:
        connector["kv_connector"], connector["kv_connector_module_path"] = CPU_CONNECTOR
    return {
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": aux_ids}},
        },
        "kv_transfer_config": connector,
        "enable_chunked_prefill": False,
    }


def run(spec: ReplicaSpec) -> ReplicaResult:
    started = time.perf_counter()
    # lazy: vllm is an optional extra
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    kwargs = platform_defaults(spec["llm"], on_cpu)
    kwargs |= capture_kwargs(spec["aux_layer_ids"], spec["scratch"], on_cpu)
    llm = LLM(**kwargs)
    die_on_fatal_signals()  # after vLLM's imports installed their handlers
    loaded = time.perf_counter()
    file = CaptureFile.open(Path(spec["file"]))
    first, end = spec["rows"]
    sequences = file.sequences()[first:end]
    params = SamplingParams(temperature=0.0, max_tokens=1)
    chunk = int(spec["chunk"])
    for start in range(0, len(sequences), chunk):
        part = sequences[start : start + chunk]
        prompts = [TokensPrompt(prompt_token_ids=s) for s in part]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        for offset, (seq, output) in enumerate(zip(part, outputs, strict=True)):
            _store(file, first + start + offset, seq, output)
        print(f"[capture] rows {first + start + len(part)}/{end}", flush=True)
    done = time.perf_counter()
    return {
        "platform": str(current_platform.device_type or "unknown"),
        "kernels": loaded_kernel_libraries(),
        "engine_config": engine_record(kwargs),
        "rows": [first, end],
        "tokens": sum(len(s) for s in sequences),
        "load_s": round(loaded - started, 2),
        "run_s": round(done - loaded, 2),
        "peak_rss_mib": tree_peak_rss_mib(),
    }


def _store(file: Any, row: int, seq: list[int], output: Any) -> None:
    """Move one finished request's states from the engine's file into ``row``."""
    # lazy: vllm is an optional extra
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states,
        load_hidden_states,
    )

    path = (output.kv_transfer_params or {}).get("hidden_states_path")
    if path is None:
        raise RuntimeError(f"row {row}: vLLM reported no hidden_states_path")
    data = load_hidden_states(path)
    if data["token_ids"].tolist() != seq:
        raise RuntimeError(f"row {row}: the engine's token ids differ from the sequence")
    states = data["hidden_states"]
    file.write_row(row, states.reshape(states.shape[0], -1))
    cleanup_hidden_states(path)


# The one entry point: the parent starts this child by importing it.
CHILD = EngineChild(run)

if __name__ == "__main__":
    CHILD.serve()
