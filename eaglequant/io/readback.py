"""Read-back of a written layout: one pass per file that checks every byte and hashes it.

Each output file is read once. Its header must equal the planned header, every
pass-through tensor must equal its input byte range, every other tensor the
bytes it was given; the same bytes feed the file's sha256 for the manifest, so
the checksums describe what is on disk, not what was meant to be written.
Files are read in parallel threads (reads, comparisons of whole chunks and
hashing release the GIL or run at memory speed).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eaglequant.io.layout import Layout, Placement, ShardFile

CHUNK = 16 * 1024 * 1024
WORKERS = 2


def readback(
    folder: Path, layout: Layout, given: dict[str, bytes]
) -> tuple[dict[str, str], list[str]]:
    """sha256 of every weight file and the problems found; ``given``: bytes of pending tensors."""
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(layout.files))) as pool:
        results = list(pool.map(lambda shard: _check_file(folder, shard, given), layout.files))
    digests = {shard.name: digest for shard, (digest, _) in zip(layout.files, results, strict=True)}
    return digests, [problem for _, problems in results for problem in problems]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_file(folder: Path, shard: ShardFile, given: dict[str, bytes]) -> tuple[str, list[str]]:
    path = folder / shard.name
    digest = hashlib.sha256()
    problems = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size != shard.size:
            problems.append(f"{shard.name} holds {size} bytes, {shard.size} were planned")
        head = os.pread(fd, len(shard.header), 0)
        digest.update(head)
        if head != shard.header:
            problems.append(f"{shard.name}: the header differs from the planned one")
        for placed in shard.placements:
            if not _same_tensor(fd, placed, _expected_reader(placed, given), digest.update):
                what = "input" if placed.blob.source is not None else "quantized bytes"
                problems.append(f"tensor '{placed.blob.name}' is not byte-identical to its {what}")
        position = shard.size
        while chunk := os.pread(fd, CHUNK, position):
            digest.update(chunk)
            position += len(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest(), problems


def _expected_reader(placed: Placement, given: dict[str, bytes]) -> Callable[[int, int], bytes]:
    """A function (offset within the tensor, size) -> the bytes that should be there."""
    blob = placed.blob
    if blob.source is not None:
        source = blob.source

        def from_file(offset: int, size: int) -> bytes:
            with source.file.open("rb", buffering=0) as handle:
                handle.seek(source.start + offset)
                return handle.read(size)

        return from_file
    data = blob.data if blob.data is not None else given.get(blob.name, b"")
    view = memoryview(data)
    return lambda offset, size: bytes(view[offset : offset + size])


def _same_tensor(
    fd: int,
    placed: Placement,
    expected: Callable[[int, int], bytes],
    hash_update: Callable[[bytes], None],
) -> bool:
    same, done, total = True, 0, placed.blob.nbytes
    while done < total:
        size = min(CHUNK, total - done)
        chunk = os.pread(fd, size, placed.start + done)
        hash_update(chunk)
        same = same and chunk == expected(done, size)
        done += size
        if len(chunk) < size:
            return False
    return same
