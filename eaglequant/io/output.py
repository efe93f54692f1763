"""Atomic outputs: a folder or a file is written as a hidden sibling and renamed into place.

A run killed half-way leaves only a hidden ``.NAME.eaglequant-tmp-PID-*``
folder, which later runs remove once its process is gone. Two runs writing the
same output race on the final rename: one wins, the other fails cleanly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from eaglequant.errors import OutputError
from eaglequant.io.writer import FILE_MODE

DIR_MODE = 0o755
TEMP_MARK = ".eaglequant-tmp-"


def check_output_path(out: Path, inputs: list[Path], overwrite: bool) -> None:
    """Refuse an output that is an input, lies inside one, or holds files (without overwrite)."""
    resolved = out.resolve()
    for src in inputs:
        src_resolved = src.resolve()
        if resolved == src_resolved or resolved.is_relative_to(src_resolved):
            raise OutputError(
                f"{out}: the output may not be the input folder {src} or lie inside it; "
                "choose another output folder"
            )
        if src_resolved.is_relative_to(resolved) and overwrite:
            raise OutputError(
                f"{out}: --overwrite would delete the input {src}, which lies inside it; "
                "choose another output folder"
            )
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: exists and is not a folder; remove it or choose another path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise OutputError(
            f"{out}: exists and is not empty; pass --overwrite to replace it or choose another path"
        )
    if not out.parent.exists():
        raise OutputError(f"{out.parent}: no such folder; create the parent folder first")


@contextlib.contextmanager
def atomic_output_dir(out: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary folder beside ``out``; on success it becomes ``out``, else vanishes."""
    remove_stale_temps(out)
    temp = Path(tempfile.mkdtemp(prefix=f".{out.name}{TEMP_MARK}{os.getpid()}-", dir=out.parent))
    try:
        os.chmod(temp, DIR_MODE)
        yield temp
        _publish(temp, out, overwrite)
    except OSError as exc:
        shutil.rmtree(temp, ignore_errors=True)
        where = f" ({exc.filename})" if exc.filename else ""
        raise OutputError(
            f"{out}: I/O error while writing: {exc.strerror or exc}{where}; nothing was "
            "written and the input is untouched, free space or fix the path and rerun"
        ) from exc
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def check_file_output(path: Path) -> None:
    """Before any work: ``path`` names a file that can be put in an existing folder."""
    if path.is_dir():
        raise OutputError(f"{path}: is a folder; name a file to write")
    if not path.parent.is_dir():
        raise OutputError(f"{path.parent}: no such folder; create the parent folder first")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a hidden sibling renamed into place: readers see the
    old file or the whole new one, never a part."""
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARK}", dir=path.parent)
    except OSError as exc:
        raise OutputError(
            f"{path}: cannot be written ({exc.strerror or exc}); create its folder or choose "
            "another path"
        ) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, FILE_MODE)
        os.replace(temp, path)
    except BaseException as exc:
        Path(temp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OutputError(
                f"{path}: I/O error while writing ({exc.strerror or exc}); nothing was written"
            ) from exc
        raise


def _publish(temp: Path, out: Path, overwrite: bool) -> None:
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise OutputError(
                f"{out}: appeared while this run was writing (another run?); nothing was "
                "replaced, pass --overwrite to replace it"
            )
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}{TEMP_MARK}old-", dir=out.parent))
        os.rename(out, old / "previous")
        os.rename(temp, out)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(temp, out)
    except OSError as exc:
        raise OutputError(
            f"{out}: could not be put in place ({exc.strerror}); another run may have written "
            "it first, nothing was replaced"
        ) from exc


def remove_stale_temps(out: Path) -> None:
    """Remove temporary folders of earlier runs on ``out`` whose process is gone."""
    if not out.parent.is_dir():
        return
    for candidate in out.parent.glob(f".{out.name}{TEMP_MARK}*"):
        pid_text = candidate.name.rsplit(TEMP_MARK, 1)[-1].split("-", 1)[0]
        if pid_text.isdigit() and pid_alive(int(pid_text)):
            continue
        shutil.rmtree(candidate, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
