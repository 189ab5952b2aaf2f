"""Prometheus metrics of one process.

Request counts and latencies are counted here as requests pass. Turn and
tool-call outcomes are read from the log itself, incrementally: at the first
scrape the counters start from the log's current position, and each scrape
counts only the events stored since, so they cover every worker of the
namespace (a counter reset at restart is normal for Prometheus). Open turns
by state and projection lag come from the read models at scrape time.
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

from application.history import count_topics
from domain.session import Session

if TYPE_CHECKING:
    from interface.roles import Parts

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
OPEN_STATES = ("queued", "running", "interrupted")


class Metrics:
    """The registry of one app, with the request metrics and the log-derived collectors."""

    def __init__(self, parts: Parts, streams: Any) -> None:
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
        self.registry.register(_LogCollector(parts, streams))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LogCollector(Collector):
    """Scrape-time metrics from the log and the read models."""

    def __init__(self, parts: Parts, streams: Any) -> None:
        self.parts = parts
        self.streams = streams
        self._lock = threading.Lock()
        self._position: int | None = None
        self._turns: dict[str, int] = dict.fromkeys(TURN_OUTCOMES.values(), 0)
        self._calls: dict[str, int] = dict.fromkeys(CALL_OUTCOMES.values(), 0)

    def describe(self) -> list[Metric]:
        return []  # metrics depend on what is running; never collect at registration

    def collect(self) -> Iterator[Metric]:
        streams = GaugeMetricFamily("turnlog_event_streams", "Open live event streams.")
        streams.add_metric([], self.streams.open)
        yield streams
        yield from self._outcomes()
        yield from self._read_model_gauges()

    def _outcomes(self) -> Iterable[Metric]:
        runtime = self.parts.runtime
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
            _, self._position = count_topics(sessions, 2**62, topics)  # just the position
            return
        counts, self._position = count_topics(sessions, self._position, topics)
        for topic, n in counts.items():
            if topic in TURN_OUTCOMES:
                self._turns[TURN_OUTCOMES[topic]] += n
            else:
                self._calls[CALL_OUTCOMES[topic]] += n

    def _read_model_gauges(self) -> Iterable[Metric]:
        read_models = self.parts.read_models
        if read_models is None:
            return []
        out: list[Metric] = []
        try:
            out.append(_open_turns(read_models))
            out.append(_lag(read_models))
        except Exception:
            log.warning("could not read the read models for metrics", exc_info=True)
        return out


def _open_turns(read_models: Any) -> Metric:
    gauge = GaugeMetricFamily("turnlog_open_turns", "Open turns by state.", labels=["state"])
    for state in OPEN_STATES:
        gauge.add_metric([state], _count(read_models, state))
    return gauge


def _count(read_models: Any, state: str, limit: int = 100_000) -> int:
    counter = getattr(read_models, "count_open_turns", None)
    if callable(counter):
        return int(counter(state))
    total, cursor = 0, None
    while total < limit:
        rows, cursor = read_models.list_open_turns(state, 500, cursor)
        total += len(rows)
        if not cursor:
            break
    return total


def _lag(read_models: Any) -> Metric:
    gauge = GaugeMetricFamily(
        "turnlog_projection_lag_events",
        "Events a read model has yet to process.",
        labels=["projection"],
    )
    for row in read_models.status():
        gauge.add_metric([str(row["name"])], float(row.get("lag_events") or 0))
    return gauge
