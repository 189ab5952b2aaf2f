"""A namespace's quotas, checked before anything is written.

``QuotaGate.admit_session()`` and ``admit_turn()`` raise ``QuotaExceeded``
(429 ``quota_exceeded`` with ``Retry-After``) when a new session or turn
would pass a limit of the tenants file; otherwise they record nothing but
the admitted turn's time (for ``turns_per_minute``).

What each limit counts:

- ``max_running_turns``: turns queued or running, as the ``open_turns`` read
  model has them (it trails the log by its lag, milliseconds when caught up);
- ``turns_per_minute``: turns this process admitted in the last 60 seconds
  (each API process counts its own);
- ``max_sessions``: sessions in the ``sessions`` read model, closed ones
  included, purged ones not;
- ``max_stored_bytes``: the namespace's tables and indexes in PostgreSQL,
  re-measured at most every ``STORED_BYTES_TTL`` seconds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from turnlog.application.errors import QuotaExceeded
from turnlog.application.tenants import Quotas

STORED_BYTES_TTL = 5.0
WINDOW_SECONDS = 60.0


class Counts(Protocol):
    """Where the gate reads a namespace's use."""

    def running_turns(self) -> int: ...

    def sessions(self) -> int: ...

    def stored_bytes(self) -> int: ...


@dataclass
class QuotaGate:
    """The quotas of one namespace, against its counts; safe to share between threads."""

    namespace: str
    quotas: Callable[[], Quotas]  # re-read on each check: a reloaded file applies at once
    counts: Counts
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._admitted: deque[float] = deque()
        self._stored: tuple[float, int] | None = None

    def admit_session(self) -> None:
        """Refuse a new session (a create or a fork) that would pass a limit."""
        quotas = self.quotas()
        self._check_stored(quotas)
        if quotas.max_sessions is not None:
            have = self.counts.sessions()
            if have >= quotas.max_sessions:
                raise self._exceeded("max_sessions", quotas.max_sessions, have, retry_after=60)

    def admit_turn(self) -> None:
        """Refuse a new turn that would pass a limit; count it when admitted."""
        quotas = self.quotas()
        self._check_stored(quotas)
        if quotas.max_running_turns is not None:
            have = self.counts.running_turns()
            if have >= quotas.max_running_turns:
                raise self._exceeded(
                    "max_running_turns", quotas.max_running_turns, have, retry_after=1
                )
        limit = quotas.turns_per_minute
        if limit is None:
            return
        with self._lock:
            now = self.clock()
            while self._admitted and self._admitted[0] <= now - WINDOW_SECONDS:
                self._admitted.popleft()
            if len(self._admitted) >= limit:
                wait = self._admitted[0] + WINDOW_SECONDS - now if self._admitted else 1.0
                raise self._exceeded(
                    "turns_per_minute", limit, len(self._admitted), retry_after=wait
                )
            self._admitted.append(now)

    def _check_stored(self, quotas: Quotas) -> None:
        limit = quotas.max_stored_bytes
        if limit is None:
            return
        now = self.clock()
        with self._lock:
            cached = self._stored
        if cached is None or now - cached[0] > STORED_BYTES_TTL:
            cached = (now, self.counts.stored_bytes())
            with self._lock:
                self._stored = cached
        if cached[1] >= limit:
            raise self._exceeded("max_stored_bytes", limit, cached[1], retry_after=60)

    def _exceeded(self, quota: str, limit: int, have: int, *, retry_after: float) -> QuotaExceeded:
        return QuotaExceeded(
            f"namespace {self.namespace!r} is at its {quota} quota ({have} of {limit});"
            " nothing was written",
            quota=quota,
            limit=limit,
            current=have,
            retry_after=max(1, int(retry_after + 0.999)),
        )
