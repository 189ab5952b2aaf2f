"""Process metrics: what the executor reports, pool statistics, and the metrics port."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from turnlog.application.observer import Observer, Unobserved
from turnlog.interface.metrics import ExecutionMetrics, MetricsServer, pool_metrics


def render(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_execution_metrics_count_outcomes_durations_and_takeovers() -> None:
    registry = CollectorRegistry()
    metrics: Observer = ExecutionMetrics(registry)
    metrics.turn_claimed(1)
    metrics.turn_claimed(2)  # a takeover
    metrics.model_called("fixture", "replied", 0.2)
    metrics.tool_called("echo", "succeeded", 0.01)
    metrics.tool_called("append_file", "failed", 0.5)
    metrics.turn_ended("completed")
    metrics.turn_ended("interrupted")

    text = render(registry)
    assert "turnlog_turn_claims_total 2.0" in text
    assert "turnlog_lease_takeovers_total 1.0" in text
    assert (
        'turnlog_model_call_duration_seconds_count{outcome="replied",provider="fixture"} 1.0'
        in (text)
    )
    assert 'turnlog_executed_tool_calls_total{outcome="failed",tool="append_file"} 1.0' in text
    assert (
        'turnlog_tool_call_duration_seconds_bucket{le="0.01",outcome="succeeded",tool="echo"}'
        in (text)
    )
    assert 'turnlog_executed_turns_total{outcome="interrupted"} 1.0' in text
    assert "turnlog_turns_interrupted_total 1.0" in text


def test_the_default_observer_ignores_everything() -> None:
    observer: Observer = Unobserved()
    observer.turn_claimed(3)
    observer.turn_ended("failed")


def test_pool_statistics_become_gauges_and_counters() -> None:
    stats = {"pool_min": 2, "pool_max": 10, "pool_size": 3, "pool_available": 1}
    stats |= {"requests_waiting": 0, "requests_num": 42}
    by_name = {m.name: m for m in pool_metrics(stats, "sessions")}

    connections = {
        s.labels["state"]: s.value for s in by_name["turnlog_db_pool_connections"].samples
    }
    assert connections == {"open": 3, "idle": 1, "min": 2, "max": 10}
    [requests] = by_name["turnlog_db_pool_requests"].samples
    assert requests.value == 42 and requests.labels == {"pool": "sessions"}
    assert pool_metrics({}, "sessions") == []


def test_the_metrics_port_serves_metrics_and_healthz_before_anything_runs() -> None:
    parts: Any = SimpleNamespace(runtime=None, worker=None, supervisor=None, read_models=None)
    server = MetricsServer(parts)
    port = server.start("127.0.0.1", 0)
    try:
        server.execution.turn_ended("completed")
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        server.stop()
    assert metrics.status_code == 200
    assert 'turnlog_executed_turns_total{outcome="completed"} 1.0' in metrics.text
    assert "_created" not in metrics.text
    assert health.status_code == 200


def test_the_application_reports_through_its_port_and_never_imports_prometheus() -> None:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "application"
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in modules if m.startswith("prometheus")}, path


def test_the_metrics_port_includes_process_and_python_defaults() -> None:
    parts: Any = SimpleNamespace(runtime=None, worker=None, supervisor=None, read_models=None)
    server = MetricsServer(parts)
    text = render(server.registry)
    assert "process_resident_memory_bytes" in text
    assert "python_info{" in text
    assert "python_gc_objects_collected_total" in text
