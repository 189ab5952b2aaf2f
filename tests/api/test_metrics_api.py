"""`/metrics` of a serve process with a worker: what it executed, its pool, the read models."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import eventually, new_session


def test_metrics_show_the_turns_this_process_ran_its_pool_and_the_read_models(
    full: TestClient,
) -> None:
    sid = new_session(full)
    turn = full.post(
        f"/v1/sessions/{sid}/turns?wait=20", json={"message": '/tool echo {"text": "x"}'}
    )
    assert turn.status_code == 200 and turn.json()["state"] == "completed", turn.text

    # The worker counts the turn just after the save that answered the wait.
    ran = 'turnlog_executed_turns_total{outcome="completed"} 1.0'
    text = eventually(lambda: ran in (t := full.get("/metrics").text) and t)

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


def _sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in /metrics")


def test_metrics_count_cancels_by_reason_decisions_and_turns_awaiting_approval(
    full: TestClient,
) -> None:
    before = full.get("/metrics").text
    cancelled = 'turnlog_turns_cancelled_total{reason="%s"}'
    decided = 'turnlog_tool_call_decisions_total{decision="%s"}'
    base = {
        name: _sample(before, name)
        for name in (
            cancelled % "operator",
            cancelled % "deadline",
            decided % "approved",
            decided % "rejected",
        )
    }
    ask = '/tool append_file {"path": "m.txt", "text": "x"}'
    waiting = []
    for _ in range(3):
        sid = new_session(full, tools=["append_file"], approval_policy="all")
        tid = full.post(f"/v1/sessions/{sid}/turns", json={"message": ask}).json()["turn_id"]
        waiting.append((sid, tid))
    calls = [
        eventually(
            lambda s=sid, t=tid: (
                (b := full.get(f"/v1/sessions/{s}/turns/{t}").json())["state"]
                == "awaiting_approval"
                and b["tool_calls"][0]["call_id"]
            ),
            deadline=30,
        )
        for sid, tid in waiting
    ]
    eventually(
        lambda: (
            _sample(full.get("/metrics").text, 'turnlog_open_turns{state="awaiting_approval"}') >= 3
        ),
        deadline=30,
    )
    (s1, _), (s2, _), (s3, t3) = waiting
    full.post(f"/v1/sessions/{s1}/tool-calls/{calls[0]}/approve", json={"actor": "a"})
    full.post(f"/v1/sessions/{s2}/tool-calls/{calls[1]}/reject", json={"actor": "a", "reason": "r"})
    full.post(f"/v1/sessions/{s3}/turns/{t3}/cancel", json={"actor": "a", "reason": "r"})
    sid = new_session(full, tools=["sleep"])
    sleep = '/tool sleep {"seconds": 30}'
    full.post(f"/v1/sessions/{sid}/turns", json={"message": sleep, "deadline_seconds": 1})

    def counted() -> dict[str, float] | None:
        text = full.get("/metrics").text
        now = {name: _sample(text, name) - was for name, was in base.items()}
        return now if now[cancelled % "deadline"] >= 1 else None

    now = eventually(counted, deadline=60)

    assert now == {
        cancelled % "operator": 1.0,
        cancelled % "deadline": 1.0,
        decided % "approved": 1.0,
        decided % "rejected": 1.0,
    }
