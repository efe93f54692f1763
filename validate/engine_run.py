"""One vLLM engine configuration in its own process.

Run as ``python -m eaglequant.validate.engine_run SPEC OUT``.

SPEC is a JSON file: target, optional draft and k, prompts, max_tokens,
max_model_len. The process starts an offline ``vllm.LLM`` (greedy,
``enforce_eager``), generates, and writes OUT with the token ids, the
spec-decode counters from ``LLM.get_metrics()``, how vLLM built each draft
layer (collected on the worker through ``collective_rpc``), and timings.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

SPEC_METRICS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_pos",
}


def draft_layers(worker: Any) -> list[dict[str, Any]]:
    """On the worker: every linear of the drafter, with its quant method, scheme and scales."""
    import torch

    drafter = getattr(worker.model_runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is None:
        return []
    layers = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if method is None or not isinstance(weight, torch.Tensor):
            continue
        scheme = getattr(module, "scheme", None)
        entry: dict[str, Any] = {
            "name": name,
            "module": type(module).__name__,
            "quant_method": type(method).__name__,
            "scheme": type(scheme).__name__ if scheme is not None else None,
            "weight_dtype": str(weight.dtype).removeprefix("torch."),
        }
        for scale_name in ("weight_scale", "input_scale"):
            scale = getattr(module, scale_name, None)
            if isinstance(scale, torch.Tensor):
                values = scale.detach().float().flatten()
                entry[scale_name] = {
                    "count": values.numel(),
                    "min": float(values.min()),
                    "max": float(values.max()),
                    "finite_positive": bool(torch.isfinite(values).all() and (values > 0).all()),
                }
        layers.append(entry)
    return layers


def _metrics(llm: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for metric in llm.get_metrics():
        key = SPEC_METRICS.get(metric.name)
        if key is None:
            continue
        if hasattr(metric, "values"):
            found[key] = [int(v) for v in metric.values]
        else:
            found[key] = int(metric.value)
    return found


def run(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    started = time.perf_counter()
    from vllm import LLM, SamplingParams

    speculative = None
    if spec.get("draft"):
        speculative = {
            "model": spec["draft"],
            "method": "eagle3",
            "num_speculative_tokens": spec["k"],
        }
    llm = LLM(
        model=spec["target"],
        speculative_config=speculative,
        enforce_eager=True,
        max_model_len=spec["max_model_len"],
        seed=0,
        disable_log_stats=False,
        trust_remote_code=bool(spec.get("trust_remote_code", False)),
    )
    loaded = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True)
    outputs = llm.generate(spec["prompts"], params, use_tqdm=False)
    generated = time.perf_counter()
    layers = llm.llm_engine.collective_rpc(draft_layers)[0] if speculative else []
    from eaglequant.validate.cpu_fp8_plugin import ACTIVE_ENV

    return {
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "texts": [o.outputs[0].text for o in outputs],
        "metrics": _metrics(llm),
        "draft_layers": layers,
        "platform": _platform(),
        "plugin_active": os.environ.get(ACTIVE_ENV) == "1" or _plugin_active_in_worker(llm),
        "load_s": round(loaded - started, 2),
        "generate_s": round(generated - loaded, 2),
    }


def plugin_state(_worker: Any) -> bool:
    from eaglequant.validate.cpu_fp8_plugin import ACTIVE_ENV

    return os.environ.get(ACTIVE_ENV) == "1"


def _plugin_active_in_worker(llm: Any) -> bool:
    return bool(llm.llm_engine.collective_rpc(plugin_state)[0])


def _platform() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type or "unknown")


def main() -> None:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    result = run(spec)
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, allow_nan=True)
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's slow interpreter teardown; the result is on disk


if __name__ == "__main__":
    main()
