"""Helpers shared by the test tiers: CLI runners, inputs for capture, and small inspectors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.engine.forkserver import process_name
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.output import TEMP_MARK
from eaglequant.model.eagle3 import Eagle3Draft
from eaglequant.results.engine_result import (
    ENGINE_RESULT_SCHEMA,
    EngineResult,
    EngineRun,
    RequestCounts,
    SpecMetrics,
)
from tests.conftest import TOY, tree_digest

# Capture: sequences and tokens per sequence of the toy captures.
SAMPLES, SEQ_LEN = 8, 64
# Compute paths: every midlayer input range within this relative tolerance across paths.
RANGE_RTOL = 2e-4
STEPS = 3


def invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output


def run_cli_checked(args: list[str]) -> tuple[int, str]:
    """Run the CLI; on failure, every folder argument is unchanged and nothing new was created."""
    # Folders given as paths (a command's name, "validate", is also the package's folder here,
    # whose __pycache__ a first import may fill)
    folders = {Path(a): tree_digest(Path(a)) for a in args if "/" in a and Path(a).is_dir()}
    absent = [Path(a) for a in args if "/" in a and not Path(a).exists()]
    result = CliRunner().invoke(main, args)
    if result.exit_code != 0:
        for folder, digest in folders.items():
            assert tree_digest(folder) == digest, f"{folder} was modified"
        for path in absent:
            assert not path.exists(), f"{path} was created"
            assert not list(path.parent.glob(f".{path.name}{TEMP_MARK}*")), "temporary folder left"
    return result.exit_code, result.output


def calib_args(pair: dict[str, Path]) -> list[str]:
    """Export's options to calibrate on the session's tiny target (transformers, 6 x 64)."""
    return [
        "--calib-target",
        str(pair["target"]),
        "--calib-data",
        str(pair["data"]),
        "--calib-samples",
        "6",
        "--calib-seq-len",
        "64",
        "--calib-engine",
        "transformers",
    ]


def check6(pair: dict[str, Path], draft: Path) -> tuple[list[str], dict[str, Any]]:
    """Check 6 (scale plausibility) of ``draft`` against the tiny pair, on one prompt."""
    from eaglequant.capture.run import CaptureEngine
    from eaglequant.recipe import ValidationSpec
    from eaglequant.validate.plausibility import PlausibilityInputs, plausibility_problems

    inputs = PlausibilityInputs(
        target=pair["target"],
        draft=read_checkpoint(draft),
        baseline=read_checkpoint(pair["draft"]),
        prompts=["def function_3(x):\n    return x * 3 + 3\n"],
        generated=None,
        k=3,
        tolerance=ValidationSpec.scale_tolerance,
        capture=CaptureEngine(name="transformers"),
    )
    return plausibility_problems(inputs)


def run_export(args: list[str]) -> None:
    """``eaglequant export ARGS``, which must succeed."""
    result = CliRunner().invoke(main, ["export", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def run_capture(pair: dict[str, Path], out: Path, *args: str) -> None:
    """``eaglequant capture`` from the session's tiny target on its data into ``out``."""
    command = ["capture", "--target", str(pair["target"]), "--data", str(pair["data"]), str(out)]
    command += ["--engine", "transformers"]
    if "--draft" not in args:
        command += ["--aux-layers", "1,2,3"]
    result = CliRunner().invoke(main, [*command, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def assert_clean_failure(code: int, output: str, pattern: str) -> None:
    assert code == 2, output
    error_lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, output
    assert pattern in error_lines[0], output
    assert "Traceback" not in output


def put_nan(draft: Path, tensor: str) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(draft / "model.safetensors"))
    tensors[tensor][0, 1] = float("nan")
    save_file(tensors, str(draft / "model.safetensors"), metadata={"format": "pt"})


def capture_args(out: Path, *extra: str, samples: int = SAMPLES) -> list[str]:
    base = ["capture", "--target", str(TOY / "target"), "--data", str(TOY / "calibration.jsonl")]
    sizes = ["--samples", str(samples), "--seq-len", str(SEQ_LEN), "--draft", str(TOY / "draft")]
    return [*base, str(out), *sizes, *extra]


def compute_batches(model: Eagle3Draft) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    dims = model.dims
    return [
        {
            "aux_hidden": 2 * torch.randn(4, 64, dims.fc_in, generator=generator),
            "next_ids": torch.randint(0, dims.vocab, (4, 64), generator=generator),
        }
        for _ in range(4)
    ]


def inspect_json(folder: Path) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(main, ["inspect", str(folder), "--json", "--target-layers", "4"])
    return result.exit_code, json.loads(result.output)


def fates_by_name(report: dict[str, Any]) -> dict[str, tuple[list[str], bool, str]]:
    return {
        f["vllm_name"]: (f["checkpoint_names"], f["quantized"], f["reason"])
        for f in report["fates"]
    }


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(ancestor: int, marker: str) -> list[int]:
    """Processes below ``ancestor`` whose command line holds ``marker`` (not others on the
    machine: another test worker may run the same commands)."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        if marker not in _cmdline(pid):
            continue
        above = _parent(pid)
        while above is not None and above > 1 and above != ancestor:
            above = _parent(above)
        if above == ancestor:
            found.append(pid)
    return found


def child_processes(ancestor: int, module: str) -> list[int]:
    """Processes below ``ancestor`` started as ``python -m module``, or forked for it by a fork
    server (a forked child keeps the server's command line; it names itself after the module)."""
    found = descendants(ancestor, module)
    name = process_name(module)
    return found + [
        pid for pid in descendants(ancestor, "eaglequant.engine.forkserver") if _comm(pid) == name
    ]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def servers_running() -> list[int]:
    """vLLM servers below this test process still running (not others on the machine)."""
    return descendants(os.getpid(), "vllm.entrypoints.openai.api_server")


def engine_result(
    metrics: SpecMetrics, per_request: list[RequestCounts | None] | None
) -> EngineResult:
    """An engine child's result holding ``metrics`` and ``per_request``, nothing generated."""
    return {
        "schema_version": ENGINE_RESULT_SCHEMA,
        "token_ids": [],
        "top_logprobs": [],
        "texts": [],
        "metrics": metrics,
        "per_request": per_request,
        "draft_layers": [],
        "platform": "cpu",
        "kernels": [],
        "plugin_active": False,
        "engine_config": {"llm": {}, "env": {}, "vllm": "0.32.0", "serve_line": "vllm serve t"},
        "load_s": 0.0,
        "generate_s": 0.0,
    }


def finished_engine(result: EngineResult) -> EngineRun:
    """An engine entry as ``run_engine`` returns it for a child that finished with ``result``."""
    return {
        "ok": True,
        "returncode": 0,
        "timed_out": False,
        "wall_s": 1.0,
        "log": "",
        "result": result,
    }


def tune_summary(draft: Path) -> Any:
    """A recorded two-point tune sweep (no speculation and k=2 at concurrency 1) of ``draft``
    on the toy target, summarized as tune writes it."""
    from eaglequant.tune.sweep import TuneRequest, TuneResult, summarize

    request = TuneRequest(
        target=TOY / "target", draft=draft, ks=(2,), concurrencies=(1,), isl=64, osl=32
    )
    results = [
        TuneResult(
            k=k,
            concurrency=1,
            runs=runs,
            mean_tpot_ms=None,
            acceptance_length=2.5 if k else None,
            per_position=[0.8, 0.7][:k],
        )
        for k, runs in ((0, [243.3, 221.3, 266.6]), (2, [210.6, 205.0, 215.1]))
    ]
    return summarize(request, results, 200)


# A chat template that writes BOS itself, as many instruct models' do.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_chat_target(folder: Path, *, adds_bos: bool) -> Path:
    """A character-level tokenizer with CHAT_TEMPLATE in ``folder``; ``adds_bos``: its own
    encoding adds BOS too (the double-BOS case a template-rendered prompt must avoid)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "<unk>": 1} | {chr(c): c for c in range(32, 127)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 0)]
        )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder
