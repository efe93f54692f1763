"""Hidden-state capture: the folder format, replica planning, and both engines on the toy target.

The vLLM tests run the real engine (``extract_hidden_states`` with the CPU
connector) in child processes. The layer-numbering proof: with the engine in
float32, vLLM's states for auxiliary id ``i`` equal transformers'
``hidden_states[i]`` within float32 rounding, so after both are stored as BF16
they differ by at most one BF16 rounding step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eaglequant.capture.store import CalibrationData, CaptureFile, sequences_tensor
from eaglequant.capture.vllm_engine import replica_env, replica_rows
from eaglequant.engine.config import VllmInstall
from eaglequant.errors import InputError
from tests.conftest import TOY
from tests.support import capture_args, invoke

CPU = VllmInstall("cpu", frozenset(), "CUDA_VISIBLE_DEVICES", 0)


GPU = VllmInstall("cuda", frozenset(), "CUDA_VISIBLE_DEVICES", 8)


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
    code, output = invoke(
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
    code, output = invoke(
        capture_args(tmp_path / "c", "--engine", "transformers", "--tensor-parallel-size", "2")
    )
    assert code == 2
    assert output == (
        "error: --tensor-parallel-size, --data-parallel-size and --engine-arg apply to "
        "--engine vllm; drop them or use vllm\n"
    )


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
