"""Pieces of a model reply while it streams, passed to live subscribers in this process.

A delta is never stored: the record holds the whole reply (``ModelReplied``)
once the provider has finished. Deltas are a preview for people watching a
session live, so they travel the cheapest way there is — an in-process
publish/subscribe hub. The worker running the turn publishes; the event
streams (SSE) of the same process subscribe. Subscribers of another process
(an API process apart from the worker) see no deltas, only the stored events.

The executor names where a provider's pieces go (``DeltaHub.streaming``, a
context variable for the duration of one model call); the provider asks for
``current_sink()`` and feeds it text, without knowing sessions or turns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from uuid import UUID

log = logging.getLogger("turnlog.deltas")


@dataclass(frozen=True)
class ReplyDelta:
    """One piece of the text of step ``step`` of a turn.

    ``offset`` is the number of characters of the reply before this piece in
    the current attempt: 0 again means the provider started over (a retry),
    so a reader drops what it showed for the step.
    """

    session_id: UUID
    turn_id: str
    step: int
    offset: int
    text: str


Subscriber = Callable[[ReplyDelta], None]


class DeltaHub:
    """Publish/subscribe of reply deltas within one process, by session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[UUID, list[Subscriber]] = {}

    def subscribe(self, session_id: UUID, subscriber: Subscriber) -> Callable[[], None]:
        """Call ``subscriber`` (from the publishing thread) for each delta; returns the undo."""
        with self._lock:
            self._subscribers.setdefault(session_id, []).append(subscriber)

        def unsubscribe() -> None:
            with self._lock:
                listed = self._subscribers.get(session_id, [])
                if subscriber in listed:
                    listed.remove(subscriber)
                if not listed:
                    self._subscribers.pop(session_id, None)

        return unsubscribe

    def subscribers(self, session_id: UUID) -> int:
        with self._lock:
            return len(self._subscribers.get(session_id, ()))

    def publish(self, delta: ReplyDelta) -> None:
        with self._lock:
            listed = list(self._subscribers.get(delta.session_id, ()))
        for subscriber in listed:
            # A subscriber's failure must never reach the model call.
            try:
                subscriber(delta)
            except Exception:
                log.exception("a reply delta subscriber failed")

    @contextmanager
    def streaming(self, session_id: UUID, turn_id: str, step: int) -> Iterator[None]:
        """Send the pieces of the provider's reply produced inside the block to this step."""
        token = _sink.set(ReplySink(self, session_id, turn_id, step))
        try:
            yield
        finally:
            _sink.reset(token)


class ReplySink:
    """Where one model call's pieces go; a provider calls ``restart`` before each attempt."""

    def __init__(
        self, hub: DeltaHub | None, session_id: UUID | None, turn_id: str, step: int
    ) -> None:
        self._hub = hub
        self._session_id = session_id
        self._turn_id = turn_id
        self._step = step
        self._offset = 0

    def restart(self) -> None:
        self._offset = 0

    def text(self, piece: str) -> None:
        if not piece or self._hub is None or self._session_id is None:
            return
        delta = ReplyDelta(self._session_id, self._turn_id, self._step, self._offset, piece)
        self._offset += len(piece)
        self._hub.publish(delta)


_NOWHERE = ReplySink(None, None, "", 0)
_sink: ContextVar[ReplySink] = ContextVar("turnlog_reply_sink", default=_NOWHERE)


def current_sink() -> ReplySink:
    """The sink of the model call in progress (one that drops everything outside of one)."""
    return _sink.get()
