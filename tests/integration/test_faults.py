"""Faults during a real export (subprocesses running real Quark): kill, disk full, a race."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.output import TEMP_MARK
from tests.conftest import tree_digest


def _export_cmd(src: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "eaglequant.cli",
        "export",
        str(src),
        str(out),
        "--calib",
        "none",
        *extra,
    ]


def _temps(out: Path) -> list[Path]:
    return list(out.parent.glob(f".{out.name}{TEMP_MARK}*"))


def test_sigkill_mid_export_leaves_no_output_and_rerun_succeeds(
    tiny_draft: Path, tmp_path: Path
) -> None:
    out = tmp_path / "fp8"
    before = tree_digest(tiny_draft)
    process = subprocess.Popen(_export_cmd(tiny_draft, out), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not _temps(out) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert _temps(out), "the export never created its temporary folder"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not out.exists()
    assert _temps(out)  # only the hidden temporary folder is left behind
    rerun = subprocess.run(_export_cmd(tiny_draft, out), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert not _temps(out), "the rerun did not clean the dead run's temporary folder"
    assert read_checkpoint(out).tensors["midlayer.mlp.up_proj.weight"].dtype == "F8_E4M3"
    assert tree_digest(tiny_draft) == before


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))


def test_write_error_is_a_clean_error_without_partial_output(
    tiny_draft: Path, tmp_path: Path
) -> None:
    # A first export fills torch's and Quark's compile caches (their compilers write
    # large files too), so that the size limit below hits the export's own writing.
    warm = subprocess.run(_export_cmd(tiny_draft, tmp_path / "warm"), capture_output=True)
    assert warm.returncode == 0
    out = tmp_path / "fp8"
    result = subprocess.run(
        _export_cmd(tiny_draft, out), capture_output=True, text=True, preexec_fn=_limit_file_size
    )
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "I/O error while writing" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not out.exists() and not _temps(out)


def test_two_exports_to_one_output_one_wins_cleanly(tiny_draft: Path, tmp_path: Path) -> None:
    out = tmp_path / "fp8"
    runs = [
        subprocess.Popen(_export_cmd(tiny_draft, out), stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(), p.stderr.read()) for p in runs]  # type: ignore[union-attr]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "error:" in loser and "Traceback" not in loser
    inspect = subprocess.run(
        [sys.executable, "-m", "eaglequant.cli", "inspect", str(out), "--json"],
        capture_output=True,
        text=True,
    )
    assert inspect.returncode == 0, inspect.stdout
    assert json.loads(inspect.stdout)["problems"] == []
    for path in [out, *out.iterdir()]:
        expected = 0o755 if path.is_dir() else 0o644
        assert path.stat().st_mode & 0o777 == expected, path


def test_own_writer_hitting_the_size_limit_leaves_nothing(tiny_draft: Path, tmp_path: Path) -> None:
    script = (
        "import sys, pathlib\n"
        "from eaglequant.io.checkpoint import read_checkpoint\n"
        "from eaglequant.errors import OutputError\n"
        "from eaglequant.io.output import atomic_output_dir\n"
        "from eaglequant.io.layout import blob_from_file\n"
        "from eaglequant.io.writer import write_checkpoint_weights\n"
        "src, out = read_checkpoint(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
        "try:\n"
        "    blobs = [blob_from_file(t) for t in src.tensors.values()]\n"
        "    with atomic_output_dir(out, overwrite=False) as temp:\n"
        "        write_checkpoint_weights(temp, blobs, 10**9)\n"
        "except OutputError as exc:\n"
        "    print(exc); sys.exit(2)\n"
    )
    out = tmp_path / "copy"
    result = subprocess.run(
        [sys.executable, "-c", script, str(tiny_draft), str(out)],
        capture_output=True,
        text=True,
        preexec_fn=_limit_file_size,
    )
    assert result.returncode == 2, result.stderr
    assert "I/O error while writing: File too large" in result.stdout
    assert not out.exists() and not _temps(out)


def test_capture_on_a_full_disk_fails_before_the_engine_and_leaves_nothing(
    pair: dict[str, Path], tmp_path: Path
) -> None:
    """The capture file is allocated whole before the target runs: a full disk (here a file
    size limit) is one clean error, and no folder is left."""
    out = tmp_path / "capture"
    args = [sys.executable, "-m", "eaglequant.cli", "capture", "--target", str(pair["target"])]
    args += ["--data", str(pair["data"]), str(out), "--engine", "transformers"]
    args += ["--aux-layers", "1,2,3", "--samples", "8", "--seq-len", "64"]
    result = subprocess.run(args, capture_output=True, text=True, preexec_fn=_limit_file_size)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "I/O error while writing: File too large" in errors[0], errors
    assert "Traceback" not in result.stderr and "capturing" not in result.stderr
    assert not out.exists() and not _temps(out)
