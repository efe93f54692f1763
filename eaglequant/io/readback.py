"""Read-back of a written layout: one pass per file that checks every byte and hashes it.

Each output file is read once. Its header must equal the planned header, every
pass-through tensor must equal its input byte range, every other tensor the
bytes it was given; the same bytes feed the file's sha256 for the manifest, so
the checksums describe what is on disk, not what was meant to be written.

The pass is resumable (:class:`ReadBack`): the export reads back and hashes
each file up to its first tensor whose bytes are still pending while Quark is
still running, and only the rest once Quark's bytes are written. Files are read
in parallel threads (reads, comparisons of whole chunks and hashing release the
GIL or run at memory speed). ``check_chunk`` sees each pass-through tensor's
bytes as read back, chunk by chunk (the export's NaN/Inf check: the copy itself
stays in the kernel and the bytes are read once, here).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eaglequant.io.layout import Layout, Placement, ShardFile
from eaglequant.io.safetensors_header import TensorInfo

CHUNK = 16 * 1024 * 1024
WORKERS = 2

Stop = Callable[[], bool]
CheckChunk = Callable[[TensorInfo, memoryview], None]


def readback(
    folder: Path, layout: Layout, given: dict[str, bytes]
) -> tuple[dict[str, str], list[str]]:
    """sha256 of every weight file and the problems found; ``given``: bytes of pending tensors."""
    return ReadBack(folder, layout).finish(given)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class ReadBack:
    """The read-back of every file of ``layout``, advanced as far as known bytes allow."""

    def __init__(self, folder: Path, layout: Layout, check_chunk: CheckChunk | None = None) -> None:
        self.files = [
            FileReadBack(folder / shard.name, shard, check_chunk) for shard in layout.files
        ]

    def advance(self, stop: Stop = lambda: False, workers: int = 1) -> None:
        """Check and hash every file up to its first pending tensor (stops early on ``stop()``)."""
        self._each(lambda file: file.advance({}, stop), workers)

    def finish(self, given: dict[str, bytes]) -> tuple[dict[str, str], list[str]]:
        """Complete every file with the pending tensors' bytes ``given``: digests and problems."""
        results = self._each(lambda file: file.finish(given), WORKERS)
        digests = {
            file.path.name: digest for file, (digest, _) in zip(self.files, results, strict=True)
        }
        return digests, [problem for _, problems in results for problem in problems]

    def _each(self, work: Callable[[FileReadBack], object], workers: int) -> list:  # type: ignore[type-arg]
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(self.files)))) as pool:
            return list(pool.map(work, self.files))


class FileReadBack:
    """One file's read-back: header, then its tensors in file order, one running sha256."""

    def __init__(self, path: Path, shard: ShardFile, check_chunk: CheckChunk | None = None) -> None:
        self.path, self.shard, self.check_chunk = path, shard, check_chunk
        self.digest = hashlib.sha256()
        self.problems: list[str] = []
        self.checked = -1  # placements checked so far; -1: not even the header

    def advance(self, given: dict[str, bytes], stop: Stop = lambda: False) -> None:
        """Go on from where the last call stopped, up to the first tensor not in ``given``."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if self.checked < 0:
                self._check_header(fd)
            placements = self.shard.placements
            while self.checked < len(placements) and not stop():
                placed = placements[self.checked]
                if placed.blob.pending and placed.blob.name not in given:
                    return
                expected = _expected_reader(placed, given)
                check = self.check_chunk if placed.blob.source is not None else None
                if not _same_tensor(fd, placed, expected, self.digest.update, check):
                    what = "input" if placed.blob.source is not None else "quantized bytes"
                    self.problems.append(
                        f"tensor '{placed.blob.name}' is not byte-identical to its {what}"
                    )
                self.checked += 1
        finally:
            os.close(fd)

    def finish(self, given: dict[str, bytes]) -> tuple[str, list[str]]:
        """Check the rest (a pending tensor not in ``given`` counts as empty): digest, problems."""
        pending = [p.blob.name for p in self.shard.placements if p.blob.pending]
        self.advance({**dict.fromkeys(pending, b""), **given})
        size = self.path.stat().st_size
        if size != self.shard.size:
            self.problems.append(
                f"{self.shard.name} holds {size} bytes, {self.shard.size} were planned"
            )
        with self.path.open("rb", buffering=0) as handle:  # bytes beyond the plan are hashed too
            handle.seek(self.shard.size)
            while chunk := handle.read(CHUNK):
                self.digest.update(chunk)
        return self.digest.hexdigest(), self.problems

    def _check_header(self, fd: int) -> None:
        head = os.pread(fd, len(self.shard.header), 0)
        self.digest.update(head)
        if head != self.shard.header:
            self.problems.append(f"{self.shard.name}: the header differs from the planned one")
        self.checked = 0


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
    check: CheckChunk | None = None,
) -> bool:
    same, done, total = True, 0, placed.blob.nbytes
    while done < total:
        size = min(CHUNK, total - done)
        chunk = os.pread(fd, size, placed.start + done)
        hash_update(chunk)
        if len(chunk) < size:
            return False
        same = same and chunk == expected(done, size)
        if check is not None and placed.blob.source is not None:
            check(placed.blob.source, memoryview(chunk))  # whole elements: CHUNK is 8-aligned
        done += size
    return same
