"""Hidden-state capture: the folder format, replica planning, and both engines on the toy target.

The vLLM tests run the real engine (``extract_hidden_states`` with the CPU
connector) in child processes. The layer-numbering proof: with the engine in
float32, vLLM's states for auxiliary id ``i`` equal transformers'
``hidden_states[i]`` within float32 rounding, so after both are stored as BF16
they differ by at most one BF16 rounding step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eaglequant.results.manifest import MANIFEST_FILE
from tests.conftest import TOY
from tests.share import built_once
from tests.support import SAMPLES, SEQ_LEN, capture_args, child_processes, invoke

# BF16 keeps 8 significant bits: two roundings of nearly equal float32 values differ by at
# most one step, 2**-7 of the value; the float32 engines themselves differ by ~1e-5 of the
# row's largest magnitude (measured worst case 5.2e-6 on the toy target).
BF16_STEP = 2.0**-7


FLOAT32_ROW = 2e-5


def _within_one_bf16_step(a: torch.Tensor, b: torch.Tensor) -> float:
    """Assert the bound; return the worst |a-b| / (one BF16 step + the float32 allowance)."""
    a, b = a.float(), b.float()
    row = b.abs().amax(dim=-1, keepdim=True)
    bound = BF16_STEP * torch.maximum(a.abs(), b.abs()) + FLOAT32_ROW * row
    worst = float(((a - b).abs() / bound).max())
    assert worst <= 1.0, worst
    return worst


def _capture(out: Path, extra: list[str]) -> None:
    code, output = invoke(capture_args(out, "--embeddings", *extra))
    assert code == 0, output


def _capture_all(root: Path, runs: dict[str, list[str]]) -> dict[str, Path]:
    """Each run's capture folder; the float32 TP=1 one is made once per ``make test`` (the
    parallel pass compares it with transformers', the serial pass with TP=2 and DP=2)."""
    folders = {}
    for name, extra in runs.items():
        if extra == FLOAT32_VLLM:
            shared = built_once(
                "capture-vllm-float32", lambda f: _capture(f / "capture", FLOAT32_VLLM), root / name
            )
            folders[name] = shared / "capture"
        else:
            _capture(root / name, extra)
            folders[name] = root / name
    return folders


FLOAT32_VLLM = ["--engine", "vllm", "--engine-arg", "dtype=float32"]


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The toy target's states: transformers, and vLLM in float32 and in BF16."""
    runs = {
        "transformers": ["--engine", "transformers"],
        "vllm": FLOAT32_VLLM,
        "vllm-bf16": ["--engine", "vllm"],
    }
    return _capture_all(tmp_path_factory.mktemp("captures"), runs)


@pytest.fixture(scope="module")
def parallel_captures(
    tmp_path_factory: pytest.TempPathFactory, every_core: None
) -> dict[str, Path]:
    """vLLM in float32 at TP=1, TP=2 and DP=2 (a core per worker: the serial pass)."""
    runs = {
        "vllm": FLOAT32_VLLM,
        "vllm-tp2": ["--engine-arg", "dtype=float32", "--tensor-parallel-size", "2"],
        "vllm-dp2": ["--engine-arg", "dtype=float32", "--data-parallel-size", "2"],
    }
    return _capture_all(tmp_path_factory.mktemp("parallel-captures"), runs)


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "hidden_states.safetensors"))


def _engine_child(process: subprocess.Popen[str], folder: Path, timeout: float = 300) -> int:
    """The capture child's pid, once the capture file it fills exists in the temporary folder."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(folder.glob(".capture*/hidden_states.safetensors")):
            children = child_processes(process.pid, "eaglequant.capture.vllm_child")
            if children:
                return children[0]
        assert process.poll() is None, process.communicate()[0]
        time.sleep(0.2)
    raise AssertionError("the capture engine never started")


def test_vllm_and_transformers_capture_the_same_layers(captures: dict[str, Path]) -> None:
    hf, vllm = _tensors(captures["transformers"]), _tensors(captures["vllm"])
    assert torch.equal(hf["input_ids"], vllm["input_ids"])
    assert torch.equal(hf["embed_tokens.weight"], vllm["embed_tokens.weight"])
    assert hf["aux_hidden_states"].shape == (SAMPLES, SEQ_LEN, 3 * 256)
    for layer in range(3):  # each auxiliary layer separately: an off-by-one fails here
        part = slice(layer * 256, (layer + 1) * 256)
        _within_one_bf16_step(
            vllm["aux_hidden_states"][..., part], hf["aux_hidden_states"][..., part]
        )
    info = json.loads((captures["vllm"] / "capture.json").read_text())
    assert info["engine"]["name"] == "vllm" and info["engine"]["vllm"]
    assert info["engine"]["tensor_parallel_size"] == 1 and info["aux_layer_ids"] == [1, 2, 3]
    assert not (captures["vllm"] / ".engine-scratch").exists()  # request files consumed


def test_tensor_and_data_parallel_captures_equal_tp1(parallel_captures: dict[str, Path]) -> None:
    captures = parallel_captures
    single = _tensors(captures["vllm"])
    for name in ("vllm-tp2", "vllm-dp2"):
        parallel = _tensors(captures[name])
        assert torch.equal(parallel["input_ids"], single["input_ids"]), name
        _within_one_bf16_step(parallel["aux_hidden_states"], single["aux_hidden_states"])
    engine = json.loads((captures["vllm-tp2"] / "capture.json").read_text())["engine"]
    assert engine["tensor_parallel_size"] == 2
    assert engine["replicas"][0]["engine_config"]["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    replicas = json.loads((captures["vllm-dp2"] / "capture.json").read_text())["engine"]["replicas"]
    assert [r["rows"] for r in replicas] == [[0, 4], [4, 8]]
    binds = [r["engine_config"]["env"]["VLLM_CPU_OMP_THREADS_BIND"] for r in replicas]
    assert binds == ["0", "1"]


def test_exports_calibrated_from_either_engine_agree(
    captures: dict[str, Path], tmp_path: Path
) -> None:
    """Input scales from the float32 captures agree within 1%; the served BF16 engine's within
    10% (its states carry BF16 arithmetic; measured worst case in the closing note)."""
    scales = {}
    for name in ("transformers", "vllm", "vllm-bf16"):
        out = tmp_path / name
        code, output = invoke(
            ["export", str(TOY / "draft"), str(out), "--calib-hidden-states", str(captures[name])]
        )
        assert code == 0, output
        scales[name] = {
            k: float(v)
            for k, v in load_file(str(out / "model.safetensors")).items()
            if k.endswith("input_scale")
        }
        manifest = json.loads((out / MANIFEST_FILE).read_text())
        assert manifest["calibration"]["capture"]["engine"]["name"] == name.split("-")[0]
    assert len(scales["vllm"]) == 7
    for name, tolerance in (("vllm", 0.01), ("vllm-bf16", 0.10)):
        ratios = {k: scales[name][k] / scales["transformers"][k] for k in scales["vllm"]}
        assert all(abs(r - 1) <= tolerance for r in ratios.values()), (name, ratios)


def test_a_target_vllm_cannot_load_fails_cleanly(tmp_path: Path) -> None:
    import shutil

    target = tmp_path / "target"
    shutil.copytree(TOY / "target", target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchLM"]}))
    out = tmp_path / "capture"
    code, output = invoke(
        [
            "capture",
            "--target",
            str(target),
            "--data",
            str(TOY / "calibration.jsonl"),
            str(out),
            "--aux-layers",
            "1,2,3",
            "--samples",
            "2",
        ]
    )
    assert code == 1, output
    lines = [line for line in output.splitlines() if not line.startswith("[eaglequant]")]
    assert len(lines) == 1 and lines[0].startswith(
        "error: vLLM capture engine (replica 0) failed (exit code 1): "
    ), output
    assert "NoSuchLM" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_an_engine_killed_mid_capture_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "capture"
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "eaglequant"), *capture_args(out, samples=64)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    os.kill(_engine_child(process, tmp_path), signal.SIGKILL)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output
    assert "error: vLLM capture engine (replica 0) failed (killed by SIGKILL)" in output
    assert not out.exists() and not list(tmp_path.iterdir())
