"""Folders built once per ``make test`` run, for its xdist workers and its serial pass alike.

``make test-rest`` points ``EAGLEQUANT_TEST_SHARE`` at a fresh folder: the first process
that asks for a folder builds it there under a lock, and every later one (the other worker,
the serial pass) waits for it and reuses it. Unset (pytest run by hand), each process
builds its own in the folder it passes.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

SHARE_ENV = "EAGLEQUANT_TEST_SHARE"


def built_once(name: str, build: Callable[[Path], None], own: Path) -> Path:
    """``name``'s folder, made by ``build`` into the empty folder it is given: the run's
    shared one when ``make test`` set a share, else ``own``."""
    root = os.environ.get(SHARE_ENV)
    if not root:
        own.mkdir(parents=True, exist_ok=True)
        build(own)
        return own
    share = Path(root)
    share.mkdir(parents=True, exist_ok=True)
    folder, done = share / name, share / f"{name}.done"
    with (share / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)  # the next one to ask builds it anew
                raise
            done.touch()
    return folder
