"""The export's clock: named spans into a timings dict (also of work in a thread of its own),
and when this process started.

Every span is ``time.perf_counter`` seconds; :func:`process_started` puts the
interpreter's own start-up on the same clock, so a stage report can begin at
the process's first instant instead of at the first line of the export.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, TypeVar, cast

T = TypeVar("T")


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Record the seconds the ``with`` block took as ``timings[name]`` (also when it raises)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = round(time.perf_counter() - started, 3)


class InThread(Generic[T]):
    """``work`` in a thread of its own from now on, its seconds into ``timings[name]``."""

    def __init__(self, work: Callable[[], T], timings: dict[str, float], name: str) -> None:
        self._error: BaseException | None = None
        self._value: T | None = None

        def run() -> None:
            try:
                with timed(timings, name):
                    self._value = work()
            except BaseException as exc:  # handed to the caller by raise_error
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"eaglequant-{name}", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        self._thread.join()

    def raise_error(self) -> None:
        """Re-raise what ``work`` raised, in the caller's thread (after :meth:`wait`)."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def result(self) -> T:
        """What ``work`` returned, once it has; what it raised is raised here."""
        self.wait()
        self.raise_error()
        return cast(T, self._value)


def process_started() -> float | None:
    """When this process started, on the ``perf_counter`` clock; None without ``/proc``.

    From ``/proc/self/stat`` (field 22, clock ticks since boot), so it covers the
    interpreter's start and every import before the caller ran.
    """
    try:
        stat = Path("/proc/self/stat").read_text()
    except OSError:
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.perf_counter() - max(age, 0.0)
