"""Workers: processes (or threads of ``serve``) that own the execution of turns.

A worker finds open turns through a ``WorkSource`` (the open_turns read
model), takes a session's lease (an advisory lock on its own connection) and
then does what recovery decides: start a queued turn, resume one whose owner
died, re-run a safe call, or interrupt a turn whose unsafe call was in
flight. Because the lease is a lock held by a live connection, a dead
worker's turns become available the moment the server notices the death.

Work is offered by the process's news feed (``application.news``): this
process's own saves of an event of ``store.topics.WORK_TOPICS`` (a submit
through its HTTP API, an approval …) the moment they commit, another
process's notification hints the moment they arrive, and the log
follower's pages, whichever brings a piece of work first; the feed tells it
once (a second offer of a session this worker already runs would run it
again, for nothing, once it let go). One loop tries the offers, and every
``poll_interval`` seconds, whatever the offers, lists the open turns for the
ones no offer names (a dead worker's turns, a turn refused earlier).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

import psycopg

from turnlog.application.errors import ApplicationError, LeaseLost
from turnlog.application.execution.cancel_watch import utc_now
from turnlog.application.execution.leases import Lease, owner_alive
from turnlog.application.execution.recovery import DONE, summarize
from turnlog.application.log_context import bound
from turnlog.application.news import News
from turnlog.application.runtime import Runtime
from turnlog.application.store.database import connect
from turnlog.application.store.topics import WORK_MARK
from turnlog.application.store.workers_registry import heartbeat, mark_stopped, register_worker
from turnlog.domain.errors import DomainError
from turnlog.domain.progress import Decision, Verdict, decide

log = logging.getLogger("turnlog.worker")


@dataclass(frozen=True)
class OpenTurnRef:
    """An open turn as the work source lists it."""

    session_id: str
    turn_id: str
    state: str


class WorkSource(Protocol):
    """Lists open turns, queued ones oldest first."""

    def open_turns(self, limit: int) -> Sequence[OpenTurnRef]: ...

    def catch_up(self, timeout: float) -> bool:
        """Wait (bounded) until the source reflects the log's current head."""
        ...


# Decisions about a turn whose owner died (not the start of a queued one): logged when done.
RECOVERIES = (
    Decision.RESUME,
    Decision.RERUN,
    Decision.INTERRUPT,
    Decision.FAIL,
    Decision.CANCEL,
)

BENCH_MAX_SECONDS = 60.0  # longest pause before retrying a turn that failed unexpectedly


class Stopping(Exception):
    """Raised inside a turn's loop when the worker drains; the turn stays for recovery."""


def check_open_turns(runtime: Runtime, source: WorkSource, limit: int = 10_000) -> list[Verdict]:
    """What recovery would do with every open turn, without acting (``turnlog check``)."""
    verdicts = []
    with connect(runtime.db) as conn:
        seen: set[str] = set()
        for ref in source.open_turns(limit):
            if ref.session_id in seen:
                continue  # a follow-up queued behind the session's current turn
            seen.add(ref.session_id)
            session_id = UUID(ref.session_id)
            session = runtime.sessions.get_session(session_id)
            turn = session.open_turn
            if turn is None:
                continue  # the read model lags behind a turn that just finished
            alive = owner_alive(conn, runtime.settings.namespace, session_id)
            verdicts.append(
                decide(
                    session,
                    turn,
                    alive,
                    runtime.executor.max_steps,
                    runtime.probed_tools(),
                    now=utc_now(),
                )
            )
    return verdicts


class Worker:
    """Finds open turns and runs them, up to ``concurrency`` at once."""

    def __init__(
        self,
        runtime: Runtime,
        source: WorkSource,
        concurrency: int = 4,
        poll_interval: float = 1.0,
    ) -> None:
        self.runtime = runtime
        self.source = source
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.worker_id = runtime.executor.worker_id
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._held: dict[str, Future[None]] = {}
        self._offers: set[str] = set()
        self._recheck: set[str] = set()  # offered while held: try again on release
        # Sessions whose turn failed unexpectedly here → (failures, not before).
        self._benched: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="turnlog-turn")
        self._threads: list[threading.Thread] = []
        self.start_summary = ""

    # ---------------------------------------------------------------- control

    def start(self) -> str:
        """Register, run the start-up check, then start finding work. Returns the summary."""
        ns = self.runtime.settings.namespace
        register_worker(self.runtime.db, ns, self.worker_id, self.concurrency)
        verdicts = check_open_turns(self.runtime, self.source)
        # Decided, not done: the turns are acted on once dispatch takes their
        # leases, and each recovery is logged again when it has been carried out.
        self.start_summary = summarize(verdicts)
        with bound(worker_id=self.worker_id):
            log.info("start-up check decided: %s", self.start_summary)
        # Offered by hints and its own saves at once: the follower's pages are a
        # safety net, so work never asks them to come promptly.
        self.runtime.sessions.news.subscribe(self._offer_news, WORK_MARK)
        for target, name in (
            (self._dispatch, "dispatch"),
            (self._heartbeat, "heartbeat"),
        ):
            thread = threading.Thread(
                target=self._bound(target), name=f"turnlog-{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self.start_summary

    def _bound(self, target: Callable[[], None]) -> Callable[[], None]:
        """``target`` with this worker's id on every line it logs (threads start unbound)."""

        def run() -> None:
            with bound(worker_id=self.worker_id):
                target()

        return run

    def wake(self) -> None:
        """Look for work now (a turn was just submitted in this process)."""
        self._wake.set()

    def stop(self, drain_timeout: float = 30.0) -> bool:
        """Drain: finish the current step of each held turn, release leases.

        Returns False when a turn was still busy at the deadline (its tool is
        still running); that turn is left to recovery by another worker.
        """
        self._stop.set()
        self._wake.set()
        self.runtime.sessions.news.unsubscribe(self._offer_news)
        with self._lock:
            futures = list(self._held.values())
        done = _wait_all(futures, drain_timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        try:
            mark_stopped(self.runtime.db, self.runtime.settings.namespace, self.worker_id)
        except (psycopg.Error, ApplicationError):
            log.warning("could not mark worker stopped", exc_info=True)
        return done

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    # ---------------------------------------------------------------- threads

    def offer(self, session_id: UUID | str) -> None:
        """A session that may have work now (a turn was submitted or resolved): try it first."""
        with self._lock:
            self._offers.add(str(session_id))
        self._wake.set()

    def _offer_news(self, news: Sequence[News]) -> None:
        """Work in a session (the news feed tells each piece once): offer it."""
        for item in news:
            self.offer(item.session_id)

    def _dispatch(self) -> None:
        """The one loop: offers as they come, and the open turns every ``poll_interval``.

        The poll runs on time whatever the offers: under a steady stream of
        offers it still finds a turn no offer names (an owner that died, a
        lease lost, a turn refused and benched), so none stays queued.
        """
        next_poll = 0.0
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_poll - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                with self._lock:
                    offers, self._offers = self._offers, set()
                for session_id in offers:
                    self._try_take(session_id)
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self.poll_interval
                    self._take_work()
            except Exception:
                log.exception("finding work failed; retrying")

    def _take_work(self) -> None:
        for ref in self.source.open_turns(limit=200):
            if self._stop.is_set() or self.held >= self.concurrency:
                return
            if ref.state == "interrupted":
                continue  # an operator must act first
            if ref.state == "awaiting_approval" and not self._deadline_passed(ref):
                continue  # an operator must approve or reject; no one holds it meanwhile
            self._try_take(ref.session_id)

    def _deadline_passed(self, ref: OpenTurnRef) -> bool:
        """Whether a turn waiting for approval is past its deadline (then it is cancelled)."""
        session = self.runtime.sessions.get_session(UUID(ref.session_id))
        turn = session.open_turn
        return turn is not None and bool(turn.cancel_due(utc_now()))

    def _try_take(self, key: str) -> None:
        """Take the session's lease and work on it, unless it is ours or a live owner's."""
        if self._stop.is_set() or self.held >= self.concurrency:
            with self._lock:
                self._offers.add(key)  # keep it for when a slot frees
            return
        with self._lock:
            if key in self._held:
                # Ours already, but the turn we run may be finishing: look again
                # when we let go, or a turn submitted just now waits for the poll.
                self._recheck.add(key)
                return
            if time.monotonic() < self._benched.get(key, (0, 0.0))[1]:
                return
        session_id = UUID(key)
        lease = self.runtime.leases.try_acquire(session_id)
        if lease is None:
            return  # a live owner holds it
        with self._lock:
            future = self._pool.submit(self._own, session_id, lease)
            self._held[key] = future
        future.add_done_callback(self._releaser(key))

    def _own(self, session_id: UUID, lease: Lease) -> None:
        # A pool thread starts with no log context: name the worker and session here.
        with bound(worker_id=self.worker_id, session_id=session_id):
            self._own_bound(session_id, lease)

    def _own_bound(self, session_id: UUID, lease: Lease) -> None:
        def told(verdict: Verdict) -> None:
            self._unbench(str(session_id))  # it went through: no pause next time
            if verdict.decision in RECOVERIES:
                log.info(
                    "recovery done: turn %s %s",
                    verdict.turn_id,
                    DONE[verdict.decision],
                    extra=verdict.as_dict(),
                )

        try:
            self.runtime.drive(session_id, lease, stop=self._stop, told=told)
            self._unbench(str(session_id))
        except (LeaseLost, Stopping) as exc:
            log.warning("stopped working on session: %s", exc)
        except (DomainError, ApplicationError) as exc:
            log.warning("turn refused: %s", exc)
            self._bench(str(session_id))
        except Exception:
            log.exception("turn crashed")
            self._bench(str(session_id))
        finally:
            lease.release()

    def _unbench(self, key: str) -> None:
        with self._lock:
            self._benched.pop(key, None)

    def _bench(self, key: str) -> None:
        """Do not take a turn that just failed unexpectedly again at once: 1, 2, 4 … 60 s.

        Retaking it at once claimed it again (an event) and failed again, in a
        loop that wrote events without end; the failure may also be passing.
        """
        with self._lock:
            failures = self._benched.get(key, (0, 0.0))[0] + 1
            delay = min(BENCH_MAX_SECONDS, 2.0 ** (failures - 1))
            self._benched[key] = (failures, time.monotonic() + delay)

    def _releaser(self, key: str) -> Callable[[Future[None]], None]:
        def release(_: Future[None]) -> None:
            with self._lock:
                self._held.pop(key, None)
                if key in self._recheck:
                    self._recheck.discard(key)
                    self._offers.add(key)
            self._wake.set()  # a slot is free

        return release

    def _heartbeat(self) -> None:
        """Keep the registry row fresh, on one connection reopened when it breaks."""
        ns = self.runtime.settings.namespace
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.wait(2.0):
            try:
                if conn is None or conn.closed:
                    conn = connect(self.runtime.db)
                heartbeat(conn, ns, self.worker_id, self.held)
            except (psycopg.Error, ApplicationError):
                log.warning("heartbeat failed; reconnecting", exc_info=True)
                conn = None
        if conn is not None:
            conn.close()


def _wait_all(futures: list[Future[None]], timeout: float) -> bool:
    from concurrent.futures import wait

    if not futures:
        return True
    _, not_done = wait(futures, timeout=timeout)
    return not not_done
