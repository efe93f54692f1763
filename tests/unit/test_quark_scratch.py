"""Where Quark's scratch folder goes: shared memory when it has room, else beside the output."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eaglequant.quantize import file_to_file

GB = 10**9


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "shm"
    folder.mkdir()
    monkeypatch.setattr(file_to_file, "SHARED_MEMORY", folder)
    return folder


def _room(monkeypatch: pytest.MonkeyPatch, free: int, available: int) -> None:
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(file_to_file.shutil, "disk_usage", lambda _p: usage._replace(free=free))
    monkeypatch.setattr(file_to_file, "_memory_available", lambda: available)


def test_scratch_in_shared_memory_only_with_room_there_and_in_ram(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged = GB  # 1 GB of BF16 in, 0.5 GB of FP8 out: 3 GB asked of both
    _room(monkeypatch, free=3 * GB, available=3 * GB)
    assert file_to_file.in_memory_scratch(staged) == shm
    _room(monkeypatch, free=3 * GB - 1, available=100 * GB)
    assert file_to_file.in_memory_scratch(staged) is None
    _room(monkeypatch, free=100 * GB, available=3 * GB - 1)
    assert file_to_file.in_memory_scratch(staged) is None


def test_no_shared_memory_means_beside_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_to_file, "SHARED_MEMORY", tmp_path / "missing")
    assert file_to_file.in_memory_scratch(1) is None


def test_the_static_flows_scratch_follows_the_same_rule(
    shm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quark's static export writes its FP8 layers into shared memory too, when it has room."""
    from eaglequant.quantize import quark_backend

    beside = tmp_path / "out-parent"
    beside.mkdir()
    _room(monkeypatch, free=3 * GB, available=3 * GB)
    with quark_backend.scratch_dir(beside, GB) as scratch:
        assert Path(scratch).parent == shm
    _room(monkeypatch, free=3 * GB - 1, available=100 * GB)
    with quark_backend.scratch_dir(beside, GB) as scratch:
        assert Path(scratch).parent == beside
    assert not list(shm.iterdir()) and not list(beside.iterdir())


def test_the_workers_allocator_keeps_freed_memory_unless_the_user_set_it() -> None:
    env = file_to_file.worker_environment({"PATH": "/bin"})
    assert env["PATH"] == "/bin"
    assert dict(i.split("=") for i in env["GLIBC_TUNABLES"].split(":")) == {
        "glibc.malloc.mmap_max": "0",
        "glibc.malloc.trim_threshold": str(1 << 40),
    }
    own = "glibc.malloc.mmap_max=4:glibc.cpu.x86_shstk=on"
    tunables = file_to_file.worker_environment({"GLIBC_TUNABLES": own})["GLIBC_TUNABLES"]
    assert tunables == f"{own}:glibc.malloc.trim_threshold={1 << 40}"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="GLIBC_TUNABLES is glibc's")
def test_with_it_a_freed_block_stays_in_the_heap_for_reuse() -> None:
    """A 256 MiB buffer: glibc's default maps it on its own and unmaps it when freed (the next
    one is faulted in afresh); with the worker's setting it comes from the heap and, freed,
    stays there (glibc's own count, ``mallinfo2``)."""
    script = (
        "import ctypes\n"
        "class Info(ctypes.Structure):\n"
        "    _fields_ = [(n, ctypes.c_size_t) for n in ('arena', 'ordblks', 'smblks', 'hblks',\n"
        "        'hblkhd', 'usmblks', 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.mallinfo2.restype = Info\n"
        "block = bytearray(1 << 28)\n"
        "mapped = libc.mallinfo2().hblkhd\n"
        "del block\n"
        "print(mapped, libc.mallinfo2().fordblks)\n"
    )

    def mapped_and_kept(env: dict[str, str]) -> tuple[int, int]:
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
        mapped, kept = (int(v) for v in done.stdout.split())
        return mapped, kept

    plain = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    mapped, kept = mapped_and_kept(plain)
    assert mapped >= 1 << 28 and kept < 1 << 28
    mapped, kept = mapped_and_kept(file_to_file.worker_environment(plain))
    assert mapped < 1 << 28 and kept >= 1 << 28
