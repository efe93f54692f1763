"""tune's benchmark client: one child imports vLLM's ``vllm bench serve`` once and runs each
measurement in turn; a failed run is named with its reason and the child goes on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from eaglequant.errors import CheckFailed
from eaglequant.tune.bench import BenchClient, bench_command
from eaglequant.tune.request import TuneRequest
from tests.conftest import TOY


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_one_client_runs_each_bench_in_turn_and_names_each_failure(tmp_path: Path) -> None:
    missing = TuneRequest(
        target=TOY / "target", draft=TOY / "draft", osl=4, prompts=tmp_path / "missing.jsonl"
    )
    unserved = TuneRequest(target=TOY / "target", draft=TOY / "draft", isl=8, osl=4)
    port, log = _closed_port(), tmp_path / "bench.log"
    with BenchClient(tmp_path / "client.log") as client:
        assert client.process is not None
        pid = client.process.pid
        cmd = bench_command(missing, port, 1, tmp_path / "r0.json")
        with pytest.raises(CheckFailed, match=r"vllm bench serve failed \(.*missing\.jsonl"):
            client.run(cmd, tmp_path / "r0.json", log, timeout=240)
        cmd = bench_command(unserved, port, 1, tmp_path / "r1.json")
        cmd += ["--ready-check-timeout-sec", "1"]
        with pytest.raises(CheckFailed, match=r"vllm bench serve failed \(") as failed:
            client.run(cmd, tmp_path / "r1.json", log, timeout=240)
        assert "missing.jsonl" not in str(failed.value)  # each run's own output, not the last
        assert client.process.poll() is None and client.process.pid == pid and client.runs == 2
    assert client.process.poll() is not None  # ended with the block
    assert not (tmp_path / "r0.json").exists() and not (tmp_path / "r1.json").exists()
    assert "missing.jsonl" in log.read_text()
