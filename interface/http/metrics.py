"""Prometheus metrics of the HTTP process.

Request counts and latencies are counted here as requests pass. Turn and
tool-call outcomes are read from the log itself, incrementally: at the first
scrape the counters start from the log's current position, and each scrape
counts only the events stored since, so they cover every worker of the
namespace (a counter reset at restart is normal for Prometheus). What this
process executes, its connection pool, open turns by state and projection
lag come from ``interface.metrics`` (shared with the processes that have no
HTTP API).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from turnlog.application.store.history import count_topics
from turnlog.application.store.logorder import Place
from turnlog.domain.session import Session
from turnlog.interface.metrics import register_process_metrics

if TYPE_CHECKING:
    from turnlog.interface.bootstrap import Process

log = logging.getLogger("turnlog.http")

# The *_created series double the output and say nothing a restart does not.
disable_created_metrics()  # type: ignore[no-untyped-call]

TURN_OUTCOMES = {
    Session.TurnCompleted.TOPIC: "completed",
    Session.TurnFailed.TOPIC: "failed",
    Session.TurnInterrupted.TOPIC: "interrupted",
    Session.TurnAbandoned.TOPIC: "abandoned",
}
CALL_OUTCOMES = {
    Session.ToolCallSucceeded.TOPIC: "succeeded",
    Session.ToolCallFailed.TOPIC: "failed",
    Session.ToolCallResolved.TOPIC: "resolved",
}


class Metrics:
    """The registry of one app, with the request metrics and the log-derived collectors."""

    def __init__(self, process: Process, streams: Any) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "turnlog_http_requests",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "turnlog_http_request_duration_seconds",
            "HTTP request duration by method and route template.",
            ["method", "route"],
            registry=self.registry,
        )
        self.registry.register(_LogCollector(process, streams))
        # What this process runs: the executor reports to ``execution`` (see interface.bootstrap).
        self.execution = register_process_metrics(self.registry, process)

    def observe(
        self, method: str, route: str, status: int, seconds: float, namespace: str | None = None
    ) -> None:
        """Count one request (``namespace``: the tenancy's, which picks this registry)."""
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LogCollector(Collector):
    """Scrape-time metrics from the log and the read models."""

    def __init__(self, process: Process, streams: Any) -> None:
        self.process = process
        self.streams = streams
        self._lock = threading.Lock()
        self._position: Place | None = None  # where to count on from, in the log's order
        self._turns: dict[str, int] = dict.fromkeys(TURN_OUTCOMES.values(), 0)
        self._calls: dict[str, int] = dict.fromkeys(CALL_OUTCOMES.values(), 0)

    def describe(self) -> list[Metric]:
        return []  # metrics depend on what is running; never collect at registration

    def collect(self) -> Iterator[Metric]:
        streams = GaugeMetricFamily("turnlog_event_streams", "Open live event streams.")
        streams.add_metric([], self.streams.open)
        yield streams
        yield from self._outcomes()

    def _outcomes(self) -> Iterable[Metric]:
        runtime = self.process.runtime
        if runtime is None:
            return []
        with self._lock:
            try:
                self._count_new(runtime.sessions)
            except Exception:
                log.warning("could not count outcomes from the log", exc_info=True)
            turns = CounterMetricFamily(
                "turnlog_turn_outcomes",
                "Turns that ended, by outcome, stored since this process started counting.",
                labels=["outcome"],
            )
            for outcome, n in self._turns.items():
                turns.add_metric([outcome], n)
            calls = CounterMetricFamily(
                "turnlog_tool_call_outcomes",
                "Tool calls that reported, by outcome, since this process started counting.",
                labels=["outcome"],
            )
            for outcome, n in self._calls.items():
                calls.add_metric([outcome], n)
        return [turns, calls]

    def _count_new(self, sessions: Any) -> None:
        topics = [*TURN_OUTCOMES, *CALL_OUTCOMES]
        if self._position is None:
            _, self._position = count_topics(sessions, None, topics)  # just the place
            return
        counts, self._position = count_topics(sessions, self._position, topics)
        for topic, n in counts.items():
            if topic in TURN_OUTCOMES:
                self._turns[TURN_OUTCOMES[topic]] += n
            else:
                self._calls[CALL_OUTCOMES[topic]] += n
