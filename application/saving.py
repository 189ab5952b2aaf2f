"""``Sessions.save`` without the library's per-object protocol checks.

The library's ``Application.save`` asks of every object it is given whether
it is a domain event, then whether it collects events, each an
``isinstance`` against a runtime-checkable ``Protocol`` (which inspects the
object's attributes: a few hundred microseconds of CPU per save). Sessions
saves its own aggregates, whose class says both answers; this does what
the library's ``save`` does (collect, record, snapshot, notify) with the
class checked instead. Anything else goes through the library's checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.application import ProcessingEvent

from turnlog.domain.session import Session


def save(app: Any, objs: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """What ``Application.save(*objs, **kwargs)`` does, for ``app``; returns its recordings."""
    processing_event: ProcessingEvent[Any] = ProcessingEvent()
    for obj in objs:
        if type(obj) is Session:
            processing_event.events.extend(obj.collect_events())
            processing_event.aggregates[obj.id] = obj
        elif obj is not None:
            processing_event.collect_events(obj)
    processing_event.saved_kwargs.update(kwargs)
    recordings = app._record(processing_event)
    app._take_snapshots(processing_event)
    app._notify(recordings)
    app.notify(processing_event.events)  # the library's deprecated hook, called as it does
    return recordings
