"""SIGTERM as the command line takes it: an exit that unwinds like Ctrl-C, held back while a
child process is being started.

The command line's handler raises ``SystemExit(128 + signal)``, so every ``finally`` on the
way out stops the engine children and servers it holds. A child is held only once
``subprocess.Popen`` (or a fork server's start) has returned its handle: an exit raised in
the middle of the start would leave the child running with no one to stop it. Inside
:func:`held`, on the main thread (where Python runs signal handlers), the handler only notes
the signal; the block's end raises the exit, after the caller has stopped what it started.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import FrameType


class _State:
    depth = 0  # nesting of held() blocks on the main thread
    pending: int | None = None  # the signal that arrived inside one


def exit_on_signal(signum: int, frame: FrameType | None) -> None:
    """The handler: ``SystemExit(128 + signum)`` now, or at the end of a :func:`held` block."""
    if _State.depth:
        _State.pending = signum
        return
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A block the handler does not interrupt (on the main thread; elsewhere it changes
    nothing): a signal inside it is raised as its exit when the outermost block ends.
    :func:`pending` says so before, for the caller to stop the child it has just started."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if not _State.depth and _State.pending is not None:
            signum, _State.pending = _State.pending, None
            raise SystemExit(128 + signum)


def pending() -> bool:
    """Whether a signal arrived inside the current :func:`held` block."""
    return _State.pending is not None
