"""Copying a pass-through tensor with its NaN/Inf check: which way is cheapest (cold input).

On the largest tensor of the Kimi-K2.5-shaped bench draft (``export_bench.py``
generates it; ``lm_head``, 2.35 GB of BF16), each way copies the tensor's byte
range into a new file, evicted from the page cache first, then fsyncs; wall
and CPU seconds of each, side by side in one run:

* ``kernel copy``: ``os.copy_file_range`` alone (the export: the read-back,
  which reads every byte anyway, checks them after);
* ``kernel copy, whole-tensor check after``: then every byte read again and
  checked with the former test (AND, compare, count);
* ``kernel copy, each 16 MiB checked after it``: each chunk read back from the
  page cache right after its copy and checked (one AND and one max per MiB);
* ``read, check, write``: each 16 MiB read into a buffer, checked, written
  (where copy_file_range is refused).

``check_alone_s`` is the test itself over the tensor's size, on a chunk already
in memory (what the read-back adds to the bytes it reads and hashes anyway).

Results go to ``bench/results-copy-check.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from eaglequant.io.safetensors_header import TensorInfo, read_header
from eaglequant.model.finite import all_finite_bytes

HERE = Path(__file__).resolve().parent
DRAFT = HERE / ".cache" / "kimi-k2.5" / "draft"
CHUNK = 16 * 1024 * 1024


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def copy_in_kernel(src: int, dst: int, info: TensorInfo, start: int, size: int) -> None:
    done = 0
    while done < size:
        done += os.copy_file_range(src, dst, size - done, info.start + start + done, start + done)


def read_into(fd: int, view: memoryview, offset: int) -> memoryview:
    got = 0
    while got < len(view):
        got += os.preadv(fd, [view[got:]], offset + got)
    return view


def former_check(fd: int, info: TensorInfo) -> None:
    """The test before: every byte read again, 64 MiB at a time, AND, compare, count."""
    step, bad = 64 * 1024 * 1024, 0
    buffer = memoryview(bytearray(step))
    for offset in range(0, info.nbytes, step):
        view = read_into(fd, buffer[: min(step, info.nbytes - offset)], info.start + offset)
        values = np.frombuffer(view, dtype=np.uint16)
        bad += int(np.count_nonzero((values & 0x7F80) == 0x7F80))
    assert bad == 0


def kernel_copy(src: int, dst: int, info: TensorInfo) -> None:
    for start in range(0, info.nbytes, 256 * 1024 * 1024):
        copy_in_kernel(src, dst, info, start, min(256 * 1024 * 1024, info.nbytes - start))


def kernel_copy_then_former_check(src: int, dst: int, info: TensorInfo) -> None:
    kernel_copy(src, dst, info)
    former_check(src, info)


def kernel_copy_each_chunk_checked(src: int, dst: int, info: TensorInfo) -> None:
    buffer = memoryview(bytearray(CHUNK))
    for start in range(0, info.nbytes, CHUNK):
        size = min(CHUNK, info.nbytes - start)
        copy_in_kernel(src, dst, info, start, size)
        assert all_finite_bytes(info.dtype, read_into(src, buffer[:size], info.start + start))


def read_check_write(src: int, dst: int, info: TensorInfo) -> None:
    buffer = memoryview(bytearray(CHUNK))
    for start in range(0, info.nbytes, CHUNK):
        view = read_into(src, buffer[: min(CHUNK, info.nbytes - start)], info.start + start)
        assert all_finite_bytes(info.dtype, view)
        written = 0
        while written < len(view):
            written += os.pwrite(dst, view[written:], start + written)


WAYS: dict[str, Callable[[int, int, TensorInfo], None]] = {
    "kernel copy": kernel_copy,
    "kernel copy, whole-tensor check after": kernel_copy_then_former_check,
    "kernel copy, each 16 MiB checked after it": kernel_copy_each_chunk_checked,
    "read, check, write": read_check_write,
}


def measure(way: Callable[[int, int, TensorInfo], None], info: TensorInfo, out: Path) -> dict:  # type: ignore[type-arg]
    os.sync()
    evict(info.file)
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    src = os.open(info.file, os.O_RDONLY)
    dst = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        way(src, dst, info)
        copied = time.perf_counter()
        os.fsync(dst)
    finally:
        os.close(src)
        os.close(dst)
    after, ended = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out.unlink()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "copy_s": round(copied - started, 3),
        "with_fsync_s": round(ended - started, 3),
        "cpu_s": round(cpu, 3),
    }


def check_alone(info: TensorInfo) -> float:
    """Seconds of the NaN/Inf test over ``info``'s size, 16 MiB in memory at a time."""
    src = os.open(info.file, os.O_RDONLY)
    try:
        chunk = read_into(src, memoryview(bytearray(CHUNK)), info.start)
    finally:
        os.close(src)
    started = time.perf_counter()
    for _ in range(info.nbytes // CHUNK):
        assert all_finite_bytes(info.dtype, chunk)
    return round(time.perf_counter() - started, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds over every way")
    parser.add_argument("--results", type=Path, default=HERE / "results-copy-check.json")
    args = parser.parse_args()
    tensors = [
        t for f in sorted(DRAFT.glob("*.safetensors")) for t in read_header(f).tensors.values()
    ]
    if not tensors:
        raise SystemExit(f"{DRAFT}: no draft; run bench/export_bench.py --shape kimi-k2.5 first")
    info = max(tensors, key=lambda t: t.nbytes)
    out = HERE / ".cache" / "copy-check.bin"
    rounds = [
        {name: measure(way, info, out) for name, way in WAYS.items()} for _ in range(args.rounds)
    ]
    results = {
        "tensor": info.name,
        "dtype": info.dtype,
        "bytes": info.nbytes,
        "rounds": rounds,
        "check_alone_s": check_alone(info),
    }
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{info.name}: {info.nbytes / 1e9:.2f} GB of {info.dtype}, cold")
    print(f"{'way':44} {'copy s':>7} {'+fsync s':>9} {'CPU s':>6}")
    print(f"the test alone, on bytes in memory: {results['check_alone_s']:.2f}s")
    for number, one in enumerate(rounds, 1):
        for name, row in one.items():
            print(
                f"{number} {name:42} {row['copy_s']:7.2f} {row['with_fsync_s']:9.2f} "
                f"{row['cpu_s']:6.2f}"
            )


if __name__ == "__main__":
    main()
