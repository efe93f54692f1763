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
from click.testing import CliRunner
from safetensors.torch import load_file

from eaglequant.capture.store import CalibrationData, CaptureFile, sequences_tensor
from eaglequant.capture.vllm_engine import replica_env, replica_rows
from eaglequant.cli import main
from eaglequant.engine.config import VllmInstall
from eaglequant.errors import InputError
from eaglequant.manifest import MANIFEST_FILE
from tests.conftest import TOY

SAMPLES, SEQ_LEN = 8, 64
CPU = VllmInstall("cpu", frozenset(), "CUDA_VISIBLE_DEVICES", 0)
GPU = VllmInstall("cuda", frozenset(), "CUDA_VISIBLE_DEVICES", 8)
# BF16 keeps 8 significant bits: two roundings of nearly equal float32 values differ by at
# most one step, 2**-7 of the value; the float32 engines themselves differ by ~1e-5 of the
# row's largest magnitude (measured worst case 5.2e-6 on the toy target).
BF16_STEP = 2.0**-7
FLOAT32_ROW = 2e-5


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output


def _capture_args(out: Path, *extra: str, samples: int = SAMPLES) -> list[str]:
    base = ["capture", "--target", str(TOY / "target"), "--data", str(TOY / "calibration.jsonl")]
    sizes = ["--samples", str(samples), "--seq-len", str(SEQ_LEN), "--draft", str(TOY / "draft")]
    return [*base, str(out), *sizes, *extra]


def _within_one_bf16_step(a: torch.Tensor, b: torch.Tensor) -> float:
    """Assert the bound; return the worst |a-b| / (one BF16 step + the float32 allowance)."""
    a, b = a.float(), b.float()
    row = b.abs().amax(dim=-1, keepdim=True)
    bound = BF16_STEP * torch.maximum(a.abs(), b.abs()) + FLOAT32_ROW * row
    worst = float(((a - b).abs() / bound).max())
    assert worst <= 1.0, worst
    return worst


# ---- the folder format and planning (no engine) ----


def test_rows_written_in_place_read_back_ragged(tmp_path: Path) -> None:
    sequences = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    file = CaptureFile.create(tmp_path / "hidden_states.safetensors", sequences, width=3)
    for row, seq in enumerate(sequences):
        file.write_row(row, torch.full((len(seq), 3), float(row + 1)))
    assert CaptureFile.open(file.path).sequences() == sequences
    tensors = load_file(str(file.path))
    assert tensors["lengths"].tolist() == [4, 2, 3]
    assert tensors["aux_hidden_states"][1, 2:].abs().sum() == 0  # padding stays zero
    data = CalibrationData(
        tensors["input_ids"], tensors["aux_hidden_states"], "t", lengths=tensors["lengths"]
    )
    assert [b["next_ids"].tolist() for b in data.batches(8)] == [[[6, 7, 8]], [[10]], [[12, 13]]]
    assert data.tokens == 9
    with pytest.raises(ValueError, match="do not fit"):
        file.write_row(0, torch.zeros(5, 3))


def test_uniform_sequences_have_no_lengths() -> None:
    ids, lengths = sequences_tensor([[1, 2], [3, 4]])
    assert ids.tolist() == [[1, 2], [3, 4]] and lengths is None


def test_replica_rows_are_contiguous_even_and_never_empty() -> None:
    assert replica_rows(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert replica_rows(2, 4) == [(0, 1), (1, 2)]


def test_replicas_get_their_own_cores_or_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    import eaglequant.capture.vllm_engine as engine

    monkeypatch.setattr(engine, "usable_cores", lambda: [0, 1, 2, 3])
    env = replica_env({}, CPU, workers=2, replica=1, replicas=2)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2|3"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    with pytest.raises(InputError, match="need 6 cores, this process may use 4"):
        replica_env({}, CPU, workers=3, replica=0, replicas=2)
    with pytest.raises(InputError, match="unset it and the tool splits the cores"):
        replica_env({"VLLM_CPU_OMP_THREADS_BIND": "0-3"}, CPU, 1, 0, 2)
    assert replica_env({}, GPU, 4, 1, 2)["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    visible = {"CUDA_VISIBLE_DEVICES": "3,5,6,7"}
    assert replica_env(visible, GPU, 2, 1, 2)["CUDA_VISIBLE_DEVICES"] == "6,7"
    with pytest.raises(InputError, match="needs 4 devices, only 4 are visible"):
        replica_env(visible, GPU, 4, 1, 2)


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ("1,2,4", "auxiliary layer 4 is outside this 4-layer target (ids 0..3 name the hidden"),
        ("1,2,2", "auxiliary layer ids [1, 2, 2] repeat a layer; vLLM captures each layer once"),
    ],
)
def test_layer_ids_the_target_lacks_are_refused_before_any_engine(
    tmp_path: Path, layers: str, message: str
) -> None:
    out = tmp_path / "capture"
    code, output = _invoke(
        [
            "capture",
            "--target",
            str(TOY / "target"),
            "--data",
            str(TOY / "calibration.jsonl"),
            str(out),
            "--aux-layers",
            layers,
        ]
    )
    assert code == 2 and output.startswith("error: ") and message in output, output
    assert len(output.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.iterdir())


def test_parallel_options_need_the_vllm_engine(tmp_path: Path) -> None:
    code, output = _invoke(
        _capture_args(tmp_path / "c", "--engine", "transformers", "--tensor-parallel-size", "2")
    )
    assert code == 2
    assert output == (
        "error: --tensor-parallel-size, --data-parallel-size and --engine-arg apply to "
        "--engine vllm; drop them or use vllm\n"
    )


def test_capture_reserves_what_it_sets(tmp_path: Path) -> None:
    code, output = _invoke(
        _capture_args(tmp_path / "c", "--engine-arg", "enable_chunked_prefill=true")
    )
    assert code == 2
    assert output == (
        "error: engine argument 'enable_chunked_prefill' is set by eaglequant; use nothing: "
        "capture turns chunked prefill off, as vLLM requires instead\n"
    )


# ---- both engines on the toy target ----

vllm_tests = pytest.mark.vllm


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The toy target's states: transformers, and vLLM in float32 at TP=1, TP=2 and DP=2."""
    root = tmp_path_factory.mktemp("captures")
    runs = {
        "transformers": ["--engine", "transformers"],
        "vllm": ["--engine", "vllm", "--engine-arg", "dtype=float32"],
        "vllm-tp2": ["--engine-arg", "dtype=float32", "--tensor-parallel-size", "2"],
        "vllm-dp2": ["--engine-arg", "dtype=float32", "--data-parallel-size", "2"],
        "vllm-bf16": ["--engine", "vllm"],
    }
    for name, extra in runs.items():
        code, output = _invoke(_capture_args(root / name, "--embeddings", *extra))
        assert code == 0, output
    return {name: root / name for name in runs}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "hidden_states.safetensors"))


@vllm_tests
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


@vllm_tests
def test_tensor_and_data_parallel_captures_equal_tp1(captures: dict[str, Path]) -> None:
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


@vllm_tests
@pytest.mark.slow
def test_exports_calibrated_from_either_engine_agree(
    captures: dict[str, Path], tmp_path: Path
) -> None:
    """Input scales from the float32 captures agree within 1%; the served BF16 engine's within
    10% (its states carry BF16 arithmetic; measured worst case in the closing note)."""
    scales = {}
    for name in ("transformers", "vllm", "vllm-bf16"):
        out = tmp_path / name
        code, output = _invoke(
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


@vllm_tests
def test_a_target_vllm_cannot_load_fails_cleanly(tmp_path: Path) -> None:
    import shutil

    target = tmp_path / "target"
    shutil.copytree(TOY / "target", target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchLM"]}))
    out = tmp_path / "capture"
    code, output = _invoke(
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


@vllm_tests
def test_an_engine_killed_mid_capture_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "capture"
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "eaglequant"), *_capture_args(out, samples=64)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    os.kill(_engine_child(process, tmp_path), signal.SIGKILL)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output
    assert "error: vLLM capture engine (replica 0) failed (killed by SIGKILL)" in output
    assert not out.exists() and not list(tmp_path.iterdir())


def _engine_child(process: subprocess.Popen[str], folder: Path, timeout: float = 300) -> int:
    """The capture child's pid, once the capture file it fills exists in the temporary folder."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = list(folder.glob(".capture*/hidden_states.safetensors"))
        for proc in Path("/proc").iterdir() if started else []:
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"eaglequant.capture.vllm_child" in cmdline:
                return int(proc.name)
        assert process.poll() is None, process.communicate()[0]
        time.sleep(0.2)
    raise AssertionError("the capture engine never started")


def test_a_failed_engine_is_reported_by_its_last_error_and_its_detail() -> None:
    from eaglequant.capture.vllm_engine import last_error

    log = (
        "INFO loading\nTraceback (most recent call last):\n  File x\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, Model architectures ['NoSuchLM'] are not supported\n"
        "    For further information visit https://errors.pydantic.dev\n"
    )
    assert last_error(log) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: "
        "Value error, Model architectures ['NoSuchLM'] are not supported"
    )
    assert last_error("RuntimeError: boom\nINFO shutting down\n") == "RuntimeError: boom"
    assert last_error("") == "(no output)"
