"""`/metrics` of a serve process with a worker: what it executed, its pool, the read models."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import new_session


def test_metrics_show_the_turns_this_process_ran_its_pool_and_the_read_models(
    full: TestClient,
) -> None:
    sid = new_session(full)
    turn = full.post(
        f"/v1/sessions/{sid}/turns?wait=20", json={"message": '/tool echo {"text": "x"}'}
    )
    assert turn.status_code == 200 and turn.json()["state"] == "completed", turn.text

    text = full.get("/metrics").text

    assert 'turnlog_executed_turns_total{outcome="completed"} 1.0' in text
    assert 'turnlog_executed_tool_calls_total{outcome="succeeded",tool="echo"} 1.0' in text
    assert (
        'turnlog_model_call_duration_seconds_count{outcome="replied",provider="fixture"} 2.0'
        in text
    )
    assert "turnlog_turn_claims_total 1.0" in text and "turnlog_lease_takeovers_total 0.0" in text
    assert 'turnlog_db_pool_connections{pool="sessions",state="open"}' in text
    assert 'turnlog_projection_runner_active{projection="sessions"} 1.0' in text
    assert 'turnlog_open_turns{state="interrupted"} 0.0' in text
    assert 'turnlog_projection_lag_seconds{projection="open_turns"}' in text
    assert "turnlog_worker_turns_held" in text
    assert text.count("# TYPE turnlog_open_turns gauge") == 1  # each family exported once
