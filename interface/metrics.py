"""Prometheus metrics of one process: execution, connection pools, read models.

- ``ExecutionMetrics`` implements the application's ``Observer`` port: turns
  this process ran by outcome, tool calls by tool and outcome, model and
  tool call durations, claims and lease takeovers (claim > 1), turns
  cancelled by reason (operator, deadline), decisions on proposed calls
  (approved, rejected).
- ``RuntimeCollector`` reads at scrape time what this process holds: the
  Sessions application's connection pool (psycopg_pool statistics), the
  worker's held turns, the projection runners' states.
- ``ReadModelCollector`` reads the namespace's read models at scrape time:
  open turns by state (``interrupted`` or ``awaiting_approval`` > 0 means an
  operator must act) and
  each read model's lag.

``serve --role …`` exposes them on its ``/metrics`` (``interface.http.metrics``
adds request metrics); ``turnlog worker`` and ``turnlog projections run``
expose them with ``--metrics-port`` through ``MetricsServer``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from turnlog.application.retention import RetentionStats
from turnlog.application.tracing import usage_attributes

if TYPE_CHECKING:
    from turnlog.interface.bootstrap import Process

log = logging.getLogger("turnlog.metrics")

# The *_created series double the output and say nothing a restart does not.
disable_created_metrics()  # type: ignore[no-untyped-call]

OPEN_STATES = ("queued", "running", "awaiting_approval", "interrupted")
MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
TOOL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
# psycopg_pool statistics that only grow (exposed as counters; absent until non-zero).
_POOL_COUNTERS = {
    "requests_num": ("turnlog_db_pool_requests", "Connections requested from the pool."),
    "requests_queued": ("turnlog_db_pool_requests_queued", "Requests that had to wait."),
    "requests_errors": ("turnlog_db_pool_request_errors", "Requests that timed out or failed."),
    "connections_num": ("turnlog_db_pool_connects", "Connections the pool opened."),
    "connections_lost": ("turnlog_db_pool_connections_lost", "Connections found broken."),
}


class ExecutionMetrics:
    """What this process executed; the ``application.observer.Observer`` of the executor."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.turns = Counter(
            "turnlog_executed_turns",
            "Turns this process ran that ended, by outcome (completed, failed, interrupted).",
            ["outcome"],
            registry=registry,
        )
        self.tool_calls = Counter(
            "turnlog_executed_tool_calls",
            "Tool calls this process ran, by tool and outcome (succeeded, failed, lost).",
            ["tool", "outcome"],
            registry=registry,
        )
        self.model_seconds = Histogram(
            "turnlog_model_call_duration_seconds",
            "Duration of model calls, by provider and outcome (replied, error).",
            ["provider", "outcome"],
            buckets=MODEL_BUCKETS,
            registry=registry,
        )
        self.tool_seconds = Histogram(
            "turnlog_tool_call_duration_seconds",
            "Duration of tool calls, by tool and outcome.",
            ["tool", "outcome"],
            buckets=TOOL_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "turnlog_model_tokens",
            "Tokens of the model calls this process made, as providers reported them, by"
            " provider and kind (input, output).",
            ["provider", "kind"],
            registry=registry,
        )
        self.claims = Counter(
            "turnlog_turn_claims", "Turn claims taken by this process.", registry=registry
        )
        self.takeovers = Counter(
            "turnlog_lease_takeovers",
            "Claims of a turn an earlier claim had owned (claim > 1): its worker died or"
            " stopped, or an operator resolved its unknown calls.",
            registry=registry,
        )
        self.interrupted = Counter(
            "turnlog_turns_interrupted",
            "Turns this process interrupted: their owner died inside a side-effecting call.",
            registry=registry,
        )
        self.cancelled = Counter(
            "turnlog_turns_cancelled",
            "Turns this process recorded cancelled, by reason (operator, deadline).",
            ["reason"],
            registry=registry,
        )
        self.decisions = Counter(
            "turnlog_tool_call_decisions",
            "Operators' decisions on proposed tool calls this process recorded, by decision"
            " (approved, rejected).",
            ["decision"],
            registry=registry,
        )
        for reason in ("operator", "deadline"):
            self.cancelled.labels(reason)
        for decision in ("approved", "rejected"):
            self.decisions.labels(decision)

    def turn_claimed(self, claim: int) -> None:
        self.claims.inc()
        if claim > 1:
            self.takeovers.inc()

    def model_called(self, provider: str, outcome: str, seconds: float) -> None:
        self.model_seconds.labels(provider, outcome).observe(seconds)

    def tokens_used(self, provider: str, usage: dict[str, Any]) -> None:
        for key, count in usage_attributes(usage).items():
            self.tokens.labels(provider, key.rsplit(".", 1)[-1].removesuffix("_tokens")).inc(count)

    def tool_started(self, tool: str) -> None:
        return None  # counted when it ends

    def tool_called(self, tool: str, outcome: str, seconds: float) -> None:
        self.tool_calls.labels(tool, outcome).inc()
        self.tool_seconds.labels(tool, outcome).observe(seconds)

    def turn_ended(self, outcome: str) -> None:
        self.turns.labels(outcome).inc()
        if outcome == "interrupted":
            self.interrupted.inc()

    def turn_cancelled(self, reason: str) -> None:
        self.cancelled.labels(reason).inc()

    def call_decided(self, decision: str) -> None:
        self.decisions.labels(decision).inc()


class RuntimeCollector(Collector):
    """Scrape-time gauges of what this process holds: pool, worker, projection runners."""

    def __init__(self, process: Process) -> None:
        self.process = process

    def describe(self) -> list[Metric]:
        return []  # depends on what runs; never collect at registration

    def collect(self) -> Iterator[Metric]:
        runtime = self.process.runtime
        if runtime is not None:
            yield from pool_metrics(_pool_stats(runtime.sessions), "sessions")
        worker = self.process.worker
        if worker is not None:
            held = GaugeMetricFamily("turnlog_worker_turns_held", "Turns this worker owns now.")
            held.add_metric([], worker.held)
            yield held
            slots = GaugeMetricFamily("turnlog_worker_concurrency", "Turns it may own at once.")
            slots.add_metric([], worker.concurrency)
            yield slots
        if self.process.supervisor is not None:
            yield from _runner_metrics(self.process.supervisor.runners())


def _pool_stats(sessions: Any) -> dict[str, int]:
    pool = getattr(getattr(sessions.recorder, "datastore", None), "pool", None)
    get_stats = getattr(pool, "get_stats", None)
    return dict(get_stats()) if callable(get_stats) else {}


def pool_metrics(stats: dict[str, int], pool: str) -> Iterable[Metric]:
    """psycopg_pool's ``get_stats()`` as gauges and counters labelled with the pool's name."""
    if not stats:
        return []
    conns = GaugeMetricFamily(
        "turnlog_db_pool_connections",
        "Connections of the pool: open (idle or in use), idle, and the configured min and max.",
        labels=["pool", "state"],
    )
    for state, key in (("open", "pool_size"), ("idle", "pool_available")):
        conns.add_metric([pool, state], stats.get(key, 0))
    for state, key in (("min", "pool_min"), ("max", "pool_max")):
        conns.add_metric([pool, state], stats.get(key, 0))
    waiting = GaugeMetricFamily(
        "turnlog_db_pool_requests_waiting", "Requests waiting for a connection.", labels=["pool"]
    )
    waiting.add_metric([pool], stats.get("requests_waiting", 0))
    out: list[Metric] = [conns, waiting]
    for key, (name, doc) in _POOL_COUNTERS.items():
        counter = CounterMetricFamily(name, doc, labels=["pool"])
        counter.add_metric([pool], stats.get(key, 0))
        out.append(counter)
    return out


def _runner_metrics(runners: list[dict[str, Any]]) -> Iterable[Metric]:
    active = GaugeMetricFamily(
        "turnlog_projection_runner_active",
        "1 when this process's runner of a read model is the active one, 0 on standby/retrying.",
        labels=["projection"],
    )
    restarts = CounterMetricFamily(
        "turnlog_projection_runner_restarts",
        "Times this process's runner of a read model restarted after an error.",
        labels=["projection"],
    )
    for runner in runners:
        active.add_metric([runner["name"]], 1 if runner["state"] == "active" else 0)
        restarts.add_metric([runner["name"]], runner.get("restarts", 0))
    return [active, restarts]


class ReadModelCollector(Collector):
    """Scrape-time gauges from the namespace's read models: open turns and lag."""

    def __init__(self, process: Process) -> None:
        self.process = process

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        read_models = self.process.read_models
        if read_models is None:
            return
        try:
            metrics = [_open_turns(read_models), *_lag(read_models.status())]
        except Exception:
            log.warning("could not read the read models for metrics", exc_info=True)
            return
        yield from metrics


def _open_turns(read_models: Any) -> Metric:
    gauge = GaugeMetricFamily(
        "turnlog_open_turns",
        "Open turns by state (interrupted and awaiting_approval ones wait for an operator).",
        labels=["state"],
    )
    for state in OPEN_STATES:
        gauge.add_metric([state], _count(read_models, state))
    return gauge


def _count(read_models: Any, state: str) -> int:
    return int(read_models.count_open_turns(state))


def _lag(rows: list[dict[str, Any]]) -> list[Metric]:
    events = GaugeMetricFamily(
        "turnlog_projection_lag_events",
        "Events a read model has yet to process.",
        labels=["projection"],
    )
    seconds = GaugeMetricFamily(
        "turnlog_projection_lag_seconds",
        "Age of the oldest event a read model has yet to process (0 when caught up).",
        labels=["projection"],
    )
    for row in rows:
        events.add_metric([str(row["name"])], float(row.get("lag_events") or 0))
        seconds.add_metric([str(row["name"])], float(row.get("lag_seconds") or 0))
    # The commit horizon (application/store/logorder.py): readers of the log wait for
    # the oldest transaction still running in the cluster; how long it has run
    # and its server pid (0 when none holds it back).
    horizon_age = GaugeMetricFamily(
        "turnlog_log_horizon_age_seconds",
        "Age of the oldest running transaction, which readers of the log wait behind.",
    )
    holder = GaugeMetricFamily(
        "turnlog_log_horizon_holder_pid",
        "Server pid of the oldest running transaction (0 when none).",
    )
    if rows:
        horizon_age.add_metric([], float(rows[0].get("horizon_age_seconds") or 0))
        holder.add_metric([], float(rows[0].get("horizon_pid") or 0))
    return [events, seconds, horizon_age, holder]


class RetentionCollector(Collector):
    """What this process's retention job purged (TURNLOG_RETENTION_DAYS), read at scrape time."""

    def __init__(self, stats: RetentionStats) -> None:
        self.stats = stats

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        for name, text, value in (
            ("turnlog_retention_runs", "Retention runs this process completed.", s.runs),
            ("turnlog_retention_failed_runs", "Retention runs that failed.", s.failed_runs),
            ("turnlog_retention_purged_sessions", "Sessions retention purged.", s.sessions),
            ("turnlog_retention_purged_events", "Events of the sessions it purged.", s.events),
            ("turnlog_retention_refused", "Due sessions whose purge was refused.", s.refused),
        ):
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], value)
            yield counter
        leading = GaugeMetricFamily(
            "turnlog_retention_leading", "1 while this process holds the retention lock."
        )
        leading.add_metric([], 1.0 if s.leading else 0.0)
        yield leading
        last = GaugeMetricFamily(
            "turnlog_retention_last_run_timestamp_seconds", "When its last run ended (0: none)."
        )
        last.add_metric([], s.last_run_at)
        yield last


def register_process_metrics(registry: CollectorRegistry, process: Process) -> ExecutionMetrics:
    """Add the execution, runtime and read-model metrics of ``process`` to ``registry``.

    Also the client library's default collectors (``process_*``: CPU, memory,
    open files; ``python_*``: version, garbage collection), which a registry
    of its own does not get unless asked.
    """
    for default in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(default)
    execution = ExecutionMetrics(registry)
    registry.register(RuntimeCollector(process))
    registry.register(ReadModelCollector(process))
    return execution


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


class NamespaceLabelled(Collector):
    """The families of several registries, merged by name, with a ``namespace`` label."""

    def __init__(self, registries: list[tuple[str, CollectorRegistry]]) -> None:
        self.registries = registries

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for namespace, registry in self.registries:
            for family in registry.collect():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                into.samples.extend(
                    Sample(
                        s.name,
                        {**s.labels, "namespace": namespace},
                        s.value,
                        s.timestamp,
                        s.exemplar,
                    )
                    for s in family.samples
                )
        yield from merged.values()


class MetricsServer:
    """``/metrics`` (and ``/healthz``) on a port of its own, for processes without the API."""

    def __init__(self, process: Process, others: Sequence[Process] = ()) -> None:
        """One process's metrics; with ``others`` (a tenants file), each process's
        under its ``namespace`` label. ``executions`` are their observers, in order."""
        self.registry = CollectorRegistry()
        self._server: Any = None
        if not others:
            self.executions = [register_process_metrics(self.registry, process)]
            return
        each = []
        self.executions = []
        for one in (process, *others):
            registry = CollectorRegistry()
            self.executions.append(register_process_metrics(registry, one))
            each.append((one.settings.namespace, registry))
        self.registry.register(NamespaceLabelled(each))

    @property
    def execution(self) -> Any:
        return self.executions[0]

    def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port) in a daemon thread; returns the port."""
        metrics = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if environ.get("PATH_INFO") == "/healthz":
                start_response("200 OK", [("Content-Type", "text/plain")])
                return [b"ok\n"]
            return metrics(environ, start_response)  # type: ignore[no-any-return]

        self._server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_Quiet)
        thread = threading.Thread(
            target=self._server.serve_forever, name="turnlog-metrics", daemon=True
        )
        thread.start()
        bound_port: int = self._server.server_port
        log.info("metrics on http://%s:%d/metrics", host, bound_port)
        return bound_port

    def start_or_exit(self, host: str, port: int) -> None:
        """``start``, or log why the port cannot be used and exit with status 2."""
        try:
            self.start(host, port)
        except OSError as exc:
            log.error("cannot serve metrics on %s:%d: %s", host, port, exc.strerror or exc)
            raise SystemExit(2) from None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
