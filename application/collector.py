"""The garbage collector around decoding that builds many objects which all live on."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

BULK = 10_000  # young objects from which a pause's end moves them to the oldest generation


@contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage collection while decoding: it would scan the process's every object often.

    Building tens of thousands of messages triggers a collection every few
    hundred allocations; in a process holding many objects, the full ones
    among them cost more than the decoding itself. What a cold load builds
    lives on (a session's entries, a request's messages), so when the young
    generation holds ``BULK`` objects or more it then joins the oldest one at
    once: ``gc.freeze`` and ``gc.unfreeze`` move every tracked object there and
    scan none, where the next allocation would start a young collection
    scanning all of it (cyclic garbage made meanwhile waits for the next full
    collection). Fewer are left to the young collections, and so is everything
    in a process that froze its start-up (``freeze_start_up``): unfreezing
    would release that.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_count()[0] >= BULK and not _START_UP_FROZEN.is_set():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def freeze_start_up() -> None:
    """Freeze what the process has made so far (``gc.freeze``): no collection scans it again.

    For a long-running process once its modules are loaded. Paused
    collectors then leave what they build to the young collections.
    """
    _START_UP_FROZEN.set()
    gc.freeze()


# Told, not asked: gc.get_freeze_count() walks every frozen object.
_START_UP_FROZEN = threading.Event()
