"""SIGTERM's exit, held back inside ``termination.held`` blocks on the main thread."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from eaglequant import termination

pytestmark = pytest.mark.unit


@pytest.fixture
def handler() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, termination.exit_on_signal)
    yield
    signal.signal(signal.SIGTERM, previous)


def _signalled() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before this returns


@pytest.mark.usefixtures("handler")
def test_outside_a_block_the_exit_is_raised_at_once() -> None:
    with pytest.raises(SystemExit) as raised:
        _signalled()
    assert raised.value.code == 128 + signal.SIGTERM


@pytest.mark.usefixtures("handler")
def test_inside_nested_blocks_the_exit_waits_for_the_outermost_end() -> None:
    reached = []
    with pytest.raises(SystemExit) as raised, termination.held():
        with termination.held():
            _signalled()
            reached.append(termination.pending())
        reached.append(termination.pending())  # the inner block's end raised nothing
    assert reached == [True, True] and raised.value.code == 128 + signal.SIGTERM
    assert not termination.pending()
    with termination.held():  # nothing left over for the next block
        pass


@pytest.mark.usefixtures("handler")
def test_a_block_on_another_thread_holds_nothing_back() -> None:
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with termination.held():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    entered.wait(10)
    try:
        with pytest.raises(SystemExit):
            _signalled()
    finally:
        release.set()
        thread.join()
