"""Writing a planned layout: the threaded writer, whole checkpoints, text and extra files.

The layout is planned first (:mod:`eaglequant.io.layout`), so every tensor's
place in every file is known before any byte is written. That lets the export
copy the pass-through gigabytes in a background thread while Quark is still
working, then drop the quantized bytes into their places (:class:`LayoutWriter`).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from eaglequant.errors import InputError
from eaglequant.io.checkpoint import INDEX_FILE
from eaglequant.io.layout import Layout, ShardFile, TensorBlob, plan_file, plan_layout
from eaglequant.io.safetensors_header import TensorInfo

FILE_MODE = 0o644
COPY_CHUNK = 256 * 1024 * 1024
LOOP_CHUNK = 16 * 1024 * 1024  # the read/write loop's buffer, where copy_file_range is refused


def write_checkpoint_weights(
    folder: Path, blobs: list[TensorBlob], max_shard_size: int
) -> list[str]:
    """Write ``blobs`` into ``folder`` as shards (+ index when more than one); return file names."""
    writer = LayoutWriter(folder, plan_layout(blobs, max_shard_size))
    writer.write_known()
    writer.finish({}, durable=False)
    return writer.layout.file_names


def write_safetensors(path: Path, blobs: Iterable[TensorBlob]) -> None:
    """Write one safetensors file, streaming file-backed blobs from their source."""
    write_known_file(path, plan_file(path.name, list(blobs)))


def write_known_file(path: Path, shard: ShardFile) -> None:
    """Write a planned file's header and known tensors; pending ranges are left zero."""
    _write_known(path.parent, shard, threading.Event())
    os.chmod(path, FILE_MODE)


class LayoutWriter:
    """Writes a planned layout: known bytes first (optionally in the background), pending later.

    ``start_background()`` copies every pass-through and in-memory tensor into
    place in a thread (the kernel copies; the GIL is free for other work);
    ``finish(pending)`` waits for it, writes the pending tensors' bytes at their
    planned offsets, the index, sets modes and fsyncs. Errors of the background
    thread are raised from ``finish`` (or at once by ``raise_if_failed``);
    ``cancel()`` stops it (between chunks).
    ``after_known()`` runs in the background thread once every known byte is
    written (the export makes them durable and reads them back there).
    """

    def __init__(
        self,
        folder: Path,
        layout: Layout,
        after_known: Callable[[], None] | None = None,
    ) -> None:
        self.folder, self.layout = folder, layout
        self.after_known = after_known
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.background_s = 0.0  # the background copy and its checks, without after_known

    def start_background(self) -> None:
        """Write (and run ``after_known``) in a thread, at the caller's priority.

        Not nicer: beside other busy processes on the same cores a nicer thread
        starves, and the export waits for it.
        """
        self._thread = threading.Thread(target=self._run, name="eaglequant-writer", daemon=True)
        self._thread.start()

    def write_known(self) -> None:
        for shard in self.layout.files:
            _write_known(self.folder, shard, self._cancel)

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            self.write_known()
            self.background_s = time.perf_counter() - started
            if self.after_known is not None and not self.cancelled():
                self.after_known()
        except BaseException as exc:  # re-raised in the caller's thread by wait()
            self._error = exc
            self.background_s = time.perf_counter() - started

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def raise_if_failed(self) -> None:
        """Raise the background thread's error now if it has already failed; never waits."""
        if self._error is not None:
            self.wait()

    def cancel(self) -> None:
        self._cancel.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def finish(self, pending: dict[str, bytes], durable: bool = True) -> None:
        """Write the pending tensors' bytes, the index and file modes; fsync when ``durable``."""
        self.wait()
        planned = {
            p.blob.name: p.blob.nbytes
            for f in self.layout.files
            for p in f.placements
            if p.blob.pending
        }
        sizes = {name: len(data) for name, data in pending.items()}
        if sizes != planned:
            raise ValueError(f"pending tensors planned as {planned}, given {sizes}")
        for name, data in pending.items():
            shard, placed = self.layout.placement(name)
            with (self.folder / shard.name).open("r+b") as out:
                pwrite_all(out.fileno(), data, placed.start)
        if self.layout.index is not None:
            write_text(self.folder / INDEX_FILE, self.layout.index)
        for shard in self.layout.files:
            os.chmod(self.folder / shard.name, FILE_MODE)
        if durable:
            self.sync()

    def sync(self) -> None:
        """fsync every weight file (after a background copy: only what was written since)."""
        for shard in self.layout.files:
            _fsync(self.folder / shard.name)


def _write_known(folder: Path, shard: ShardFile, cancel: threading.Event) -> None:
    with (folder / shard.name).open("wb") as out:
        out.truncate(shard.size)
        pwrite_all(out.fileno(), shard.header, 0)
        for placed in shard.placements:
            if cancel.is_set():
                return
            if placed.blob.data is not None:
                if len(placed.blob.data) != placed.blob.nbytes:
                    raise ValueError(
                        f"{placed.blob.name}: {len(placed.blob.data)} bytes for "
                        f"{placed.blob.dtype}{list(placed.blob.shape)}"
                    )
                pwrite_all(out.fileno(), placed.blob.data, placed.start)
            elif placed.blob.source is not None:
                copy_range(placed.blob.source, out.fileno(), placed.start, cancel)


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def copy_range(info: TensorInfo, out_fd: int, out_offset: int, cancel: threading.Event) -> None:
    """Copy ``info``'s bytes to ``out_offset`` of ``out_fd`` by byte range, nothing parsed.

    ``os.copy_file_range`` copies in the kernel, the bytes never pass through this
    process; where the file systems refuse it (an OSError before any byte moved:
    another file system, an old kernel) the rest goes through one reused buffer.
    """
    buffer = bytearray(0)  # grown on need: only the read/write loop uses it
    in_kernel = True
    with info.file.open("rb", buffering=0) as src:
        done = 0
        while done < info.nbytes and not cancel.is_set():
            count = min(COPY_CHUNK if in_kernel else LOOP_CHUNK, info.nbytes - done)
            if in_kernel:
                in_kernel = _copy_in_kernel(src.fileno(), out_fd, count, info, done, out_offset)
            if not in_kernel:
                if len(buffer) < count:
                    buffer = bytearray(count)
                pwrite_all(
                    out_fd, _pread_exact(src.fileno(), buffer, count, info, done), out_offset + done
                )
            done += count


def _copy_in_kernel(
    src: int, out_fd: int, count: int, info: TensorInfo, done: int, out_offset: int
) -> bool:
    """``count`` bytes of ``info`` from ``done`` on by ``os.copy_file_range``; False (nothing
    copied) where the file systems refuse it."""
    sent = 0
    while sent < count:
        try:
            step = os.copy_file_range(
                src, out_fd, count - sent, info.start + done + sent, out_offset + done + sent
            )
        except OSError:
            if sent:
                raise
            return False
        if step == 0:
            raise InputError(f"{info.file}: ended early while copying '{info.name}'")
        sent += step
    return True


def _pread_exact(fd: int, buffer: bytearray, size: int, info: TensorInfo, done: int) -> memoryview:
    """``size`` bytes of ``info`` from ``done`` on, read into ``buffer``."""
    view = memoryview(buffer)[:size]
    got = 0
    while got < size:
        read = os.preadv(fd, [view[got:]], info.start + done + got)
        if read == 0:
            raise InputError(f"{info.file}: ended early while copying '{info.name}'")
        got += read
    return view


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    os.chmod(path, FILE_MODE)


def copy_extra_files(src: Path, dst: Path, skip: set[str]) -> list[str]:
    """Copy the non-weight files (tokenizer, generation config, …) from ``src`` to ``dst``."""
    copied = []
    for path in sorted(src.iterdir()):
        name = path.name
        if name in skip or name.endswith(".safetensors") or not path.is_file():
            continue
        if name.startswith(".") or name == INDEX_FILE:
            continue
        if not path.resolve().is_relative_to(src.resolve()):
            continue
        shutil.copyfile(path, dst / name)
        os.chmod(dst / name, FILE_MODE)
        copied.append(name)
    return copied
