"""A long-running command's stop signal: seen however the signal arrives, never a hang."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from turnlog.interface.terminal import SignalStop, stop_on_signals


@pytest.fixture
def handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_signal_sent_while_the_main_thread_waits_sets_the_stop(handlers: None) -> None:
    stop = stop_on_signals()
    sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM))
    sender.start()
    assert stop.wait(timeout=60) is True
    sender.join()
    assert stop.signum == signal.SIGTERM


def test_a_wait_with_a_timeout_and_no_signal_returns_false() -> None:
    stop = SignalStop()
    assert stop.wait(timeout=0.05) is False
    assert not stop.is_set()
