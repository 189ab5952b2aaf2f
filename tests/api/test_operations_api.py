"""Health, readiness, metrics, request ids, and the errors that are not business rules."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import FAST, eventually, new_session, problem, run_queued_turn
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.interface.http import create_app


def test_healthz_and_readyz_answer_when_the_database_is_up(api: TestClient) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz").json()
    assert ready["status"] == "ready"
    assert ready["checks"]["database"] is True


def test_readyz_and_the_console_say_when_the_sandbox_is_off(
    settings: Settings, runtime: Runtime
) -> None:
    for sandbox in ("on", "off"):
        app = create_app(settings.model_copy(update={"sandbox": sandbox}), role="api", options=FAST)
        with TestClient(app, raise_server_exceptions=False) as client:
            ready = client.get("/readyz").json()
            page = client.get("/console").text
        if sandbox == "on":
            assert ready["sandbox"] == "on" and 'id="sandbox-off"' not in page
        else:
            assert ready["sandbox"].startswith("off: tool processes run unconfined")
            assert ready["status"] == "ready"  # a warning, not an outage
            assert 'id="sandbox-off"' in page and "TURNLOG_SANDBOX=off" in page


def test_an_unreachable_database_is_503_with_retry_after_while_liveness_holds(
    settings: Settings, tmp_path: object
) -> None:
    # Port 1 on loopback refuses connections: the database is "down".
    down = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/x"})
    app = create_app(down, options=FAST)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/healthz").status_code == 200
        not_ready = problem(client.get("/readyz"), 503, "not_ready")
        assert not_ready["checks"]["database"] is False
        refused = client.post("/v1/sessions", json={})
        problem(refused, 503, "database_unavailable")
        assert refused.headers["retry-after"] == "5"
        assert "password" not in refused.text


def test_unknown_routes_and_methods_are_problems(api: TestClient) -> None:
    problem(api.get("/v1/nothing-here"), 404, "not_found")
    problem(api.delete("/v1/sessions"), 405, "method_not_allowed")


def test_a_bug_is_a_500_problem_logged_with_the_request_id(
    settings: Settings, runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(settings, options=FAST)

    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/v1/broken", broken)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/v1/broken")

    body = problem(response, 500, "internal_error")
    assert "a bug" not in body["detail"]  # internals stay in the log
    logged = [r for r in caplog.records if getattr(r, "request_id", None) == body["request_id"]]
    assert logged and "a bug" in (logged[0].exc_text or str(logged[0].exc_info))


def test_a_client_request_id_is_echoed_and_a_missing_one_generated(api: TestClient) -> None:
    echoed = api.get("/healthz", headers={"X-Request-ID": "trace-123"})
    assert echoed.headers["x-request-id"] == "trace-123"
    generated = api.get("/healthz", headers={"X-Request-ID": "bad id with spaces"})
    assert re.fullmatch(r"[0-9a-f]{32}", generated.headers["x-request-id"])


def test_metrics_count_requests_by_route_and_turn_and_tool_call_outcomes(
    api: TestClient, runtime: Runtime
) -> None:
    api.get("/metrics")  # the outcome counters start from the log position of the first scrape
    sid = new_session(api)
    api.post(f"/v1/sessions/{sid}/turns", json={"message": '/tool echo {"text": "x"}'})
    run_queued_turn(runtime, sid)
    api.get(f"/v1/sessions/{sid}/turns/nope")

    # The outcome counters count the log up to its commit horizon, which another
    # client's open transaction may hold back for a moment: wait until both are in.
    outcomes = (
        'turnlog_turn_outcomes_total{outcome="completed"} 1.0',
        'turnlog_tool_call_outcomes_total{outcome="succeeded"} 1.0',
    )

    def scraped() -> str | None:
        text = api.get("/metrics").text
        return text if all(line in text for line in outcomes) else None

    text = eventually(scraped)

    assert (
        'turnlog_http_requests_total{method="POST",route="/v1/sessions",status="201"} 1.0' in text
    )
    assert (
        'turnlog_http_requests_total{method="GET",'
        'route="/v1/sessions/{session_id}/turns/{turn_id}",status="404"} 1.0'
    ) in text
    assert 'turnlog_turn_outcomes_total{outcome="completed"} 1.0' in text
    assert 'turnlog_tool_call_outcomes_total{outcome="succeeded"} 1.0' in text
    assert "turnlog_event_streams 0.0" in text
    assert "turnlog_http_request_duration_seconds_bucket" in text


def test_the_openapi_schema_documents_problems_and_the_event_stream(api: TestClient) -> None:
    schema = api.get("/openapi.json").json()
    submit = schema["paths"]["/v1/sessions/{session_id}/turns"]["post"]
    assert set(submit["responses"]) >= {"200", "202", "401", "404", "409", "413", "422", "503"}
    assert "application/problem+json" in submit["responses"]["409"]["content"]
    events = schema["paths"]["/v1/sessions/{session_id}/events"]["get"]
    assert "text/event-stream" in events["responses"]["200"]["content"]
    assert "securitySchemes" not in schema.get("components", {})  # no token: no auth


def test_unknown_query_parameters_are_refused(api: TestClient) -> None:
    refused = problem(api.get("/v1/sessions?stauts=busy"), 422, "validation_error")
    assert refused["unknown_parameters"] == ["stauts"]
