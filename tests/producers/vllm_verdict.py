"""What the installed vLLM does with each producer fixture: parses its config, builds, runs.

Runs in eaglequant's full venv (vLLM installed), one engine at a time:

    flock LOCKFILE .venv/bin/python tests/producers/vllm_verdict.py \
        --target examples/toy/target --drafts tests/producers/toy --json OUT.json [NAME ...]

For every draft folder (and the BF16 draft given by ``--baseline``), in a child process:

1. vLLM's quantization config for the draft's ``quant_method``
   (``get_quantization_config(method).from_config``) and, for compressed-tensors, the
   library's own ``QuantizationConfig.model_validate``: parsed, or the exception's line.
2. A speculative engine on the CPU (EAGLE-3, k=3, greedy, the pair's held-out prompts) with
   eaglequant's CPU plugin as ``eaglequant validate`` runs it: every draft linear vLLM built
   (linear method, scheme, weight dtype, whether its scales are finite and positive) and the
   spec-decode counters, or the last line of the error that stopped it.

The records are evidence for the fixture table in README.md, not a gate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = 8
MAX_TOKENS = 32
K = 3
CHILD_TIMEOUT_S = 240


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafts", type=Path, help="folder of draft folders (required)")
    parser.add_argument("--baseline", type=Path, help="the BF16 draft, run first")
    parser.add_argument("--prompts", type=Path, default=Path("examples/toy/prompts.jsonl"))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument(
        "--parse-only", action="store_true", help="step 1 and the config's per-layer decision"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="*", help="only these fixtures (default: all)")
    args = parser.parse_args()
    if args.child:
        return _child(args.target, Path(args.names[0]), args.prompts)
    if args.drafts is None:
        parser.error("the following arguments are required: --drafts")
    folders = sorted(p for p in args.drafts.iterdir() if (p / "config.json").is_file())
    if args.names:  # in the order given
        by_name = {p.name: p for p in folders}
        folders = [by_name[name] for name in args.names if name in by_name]
    if args.baseline:
        folders.insert(0, args.baseline)
    records = json.loads(args.json.read_text()) if args.json.is_file() else {}
    if args.parse_only:
        layers = json.loads((args.target / "config.json").read_text())["num_hidden_layers"]
        for folder in folders:
            records[folder.name] = {"parse": _parse(folder, layers)}
            print(f"{folder.name}: {json.dumps(records[folder.name]['parse'])}", flush=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")
        return 0
    for folder in folders:
        name = folder.name if folder != args.baseline else "bf16-baseline"
        records[name] = _run_child(args.target, folder, args.prompts)
        print(f"{name}: {_summary(records[name])}", flush=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    return 0


def _run_child(target: Path, draft: Path, prompts: Path) -> dict:
    command = [sys.executable, __file__, "--child", "--target", str(target)]
    command += ["--prompts", str(prompts), "--json", "-", str(draft)]
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return {"engine": {"error": f"timed out after {CHILD_TIMEOUT_S} s"}}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    record = json.loads(lines[-1]) if lines else {}
    record["wall_s"] = round(time.perf_counter() - started, 1)
    if done.returncode != 0 or "engine" not in record:
        errors = [line for line in done.stderr.splitlines() if "Error" in line or "error" in line]
        tail = errors[-3:] or done.stderr.strip().splitlines()[-3:]
        record.setdefault("engine", {})["error"] = tail
    return record


def _child(target: Path, draft: Path, prompts: Path) -> int:
    record: dict = {"parse": _parse(draft)}
    print(json.dumps(record), flush=True)  # kept if the engine dies below
    record["engine"] = _engine(target, draft, prompts)
    print(json.dumps(record), flush=True)
    return 0


def _parse(draft: Path, target_layers: int | None = None) -> dict:
    quant = json.loads((draft / "config.json").read_text()).get("quantization_config")
    if quant is None:
        return {"quant_method": None}
    method = quant.get("quant_method")
    found: dict = {"quant_method": method}
    try:
        from vllm.model_executor.layers.quantization import get_quantization_config

        config = get_quantization_config(method).from_config(dict(quant))
        found["vllm_config"] = type(config).__name__
        if target_layers is not None:
            found["decisions"] = _decisions(config, method, target_layers)
    except Exception as error:
        found["vllm_error"] = f"{type(error).__name__}: {error}"
    if method == "compressed-tensors":
        try:
            from compressed_tensors.quantization import QuantizationConfig

            QuantizationConfig.model_validate(dict(quant))
            found["compressed_tensors"] = "valid"
        except Exception as error:
            found["compressed_tensors"] = f"{type(error).__name__}: {error}".splitlines()[0]
    return found


def _decisions(config: object, method: str, target_layers: int) -> dict[str, str]:
    """What the parsed config alone decides for each linear vLLM builds for an EAGLE-3 draft.

    The config as ``get_draft_quant_config`` builds it: from the draft's config.json, with no
    model mapping applied (no ``packed_modules_mapping``, no ``hf_to_vllm_mapper``).
    """
    import torch

    layer = f"model.layers.{target_layers}"
    prefixes = [
        "model.fc",
        f"{layer}.self_attn.qkv_proj",
        f"{layer}.self_attn.o_proj",
        f"{layer}.mlp.gate_up_proj",
        f"{layer}.mlp.down_proj",
        "lm_head",
    ]
    found = {}
    for prefix in prefixes:
        if method == "modelopt":
            excluded = config.is_layer_excluded(prefix)  # type: ignore[attr-defined]
            found[prefix] = "excluded (BF16)" if excluded else "quantized"
        elif method == "compressed-tensors":
            scheme = config.get_scheme_dict(torch.nn.Linear(1, 1), prefix)  # type: ignore[attr-defined]
            weights = scheme.get("weights") if scheme else None
            found[prefix] = "ignored (BF16)" if weights is None else f"FP8 {weights.strategy}"
    return found


def _engine(target: Path, draft: Path, prompts: Path) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    from eaglequant.engine.config import platform_defaults, platform_env, usable_cores
    from eaglequant.validate.engine_run import require_cpu_patches, spec_metrics

    on_cpu = current_platform.is_cpu()
    if on_cpu:
        require_cpu_patches()
    speculative = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": K}
    kwargs = platform_defaults(
        {"model": str(target), "speculative_config": speculative, "seed": 0}, on_cpu
    )
    os.environ.update(platform_env(os.environ, on_cpu, 1, usable_cores()))
    llm = LLM(
        **kwargs,
        disable_log_stats=False,
        worker_extension_cls="eaglequant.validate.engine_run.DraftInspector",
    )
    (layers,) = llm.collective_rpc("eaglequant_draft_layers")
    texts = [json.loads(line)["text"] for line in prompts.read_text().splitlines()][:PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.generate(texts, params, use_tqdm=False)
    metrics = spec_metrics(llm)
    drafted, accepted = metrics["num_draft_tokens"], metrics["num_accepted_tokens"]
    return {
        "layers": [_layer(layer) for layer in layers],
        "metrics": metrics,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "mean_acceptance_length": round(1 + accepted / metrics["num_drafts"], 4)
        if metrics["num_drafts"]
        else None,
    }


def _layer(layer: dict) -> dict:
    scales = {
        key: value["finite_positive"]
        for key, value in layer.items()
        if isinstance(value, dict) and "finite_positive" in value
    }
    return {
        "name": layer["name"],
        "built_as": layer["scheme"] or layer["quant_method"],
        "weight_dtype": layer["weight_dtype"],
        "scales_finite_positive": scales,
    }


def _summary(record: dict) -> str:
    engine = record.get("engine", {})
    if "error" in engine:
        return f"engine error: {engine['error']}"
    built = sorted({f"{x['built_as']}/{x['weight_dtype']}" for x in engine["layers"]})
    return f"acceptance {engine['acceptance_rate']}, built {built}"


if __name__ == "__main__":
    sys.exit(main())
