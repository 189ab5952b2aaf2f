"""Schemathesis against the live /openapi.json: no 5xx, no response that breaks the schema.

The server runs for real (uvicorn on a loopback port, role ``all`` so that
turns complete). It runs without a token, so the schema declares no
security and negative cases are judged on their own data (auth is tested
in test_security_api). Examples per operation are bounded (20 by default, each
way) so the run stays short — about two minutes inside a busy ``make test``;
``TURNLOG_FUZZ_EXAMPLES`` scales it (``make chaos`` sends more than 2,000
requests). Every refused request (4xx/5xx) must
leave the log exactly as it was, and a stateful run chains operations
through the links schemathesis infers (a created session's id into its turns,
…), so generated requests reach existing sessions, not only the 404 path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import FAST, live_server
from turnlog.application.settings import Settings
from turnlog.interface.http import create_app

EXAMPLES = int(os.environ.get("TURNLOG_FUZZ_EXAMPLES", "20"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


# What a request can write; the rest (claims, replies, tool calls, endings) is
# the in-process worker finishing earlier turns meanwhile.
REQUEST_TOPICS = {"SessionStarted", "TurnSubmitted", "TurnAbandoned", "ToolCallResolved"}
REQUEST_TOPICS |= {"SessionClosed"}


@dataclass
class Tally:
    """Requests sent, and refused requests that nonetheless wrote to the log."""

    head: Any  # () -> (position, topics) of the namespace's log
    sent: int = 0
    refused: int = 0
    writes_by_refused: list[str] = field(default_factory=list)

    def call(self, case: Any, check: Any) -> None:
        before = self.head()
        response = None
        try:
            response = case.call(base_url=_BASE[0], timeout=70)
            check(response)
        finally:
            self.sent += 1
            if response is not None and response.status_code >= 400:
                self.refused += 1
                written = self.head()[1][len(before[1]) :]
                if REQUEST_TOPICS & set(written):
                    self.writes_by_refused.append(f"{case.method} {case.formatted_path}: {written}")


_BASE: list[str] = [""]


@pytest.fixture(scope="module")
def tally(live: str, request: pytest.FixtureRequest) -> Tally:
    from tests.conftest import raw_events

    database, namespace = request.getfixturevalue("database"), _NAMESPACE[0]

    def head() -> tuple[int, list[str]]:
        rows = raw_events(database, namespace)
        return (rows[-1][0] if rows else 0), [r[3].split(".")[2] for r in rows]

    return Tally(head)


_NAMESPACE: list[str] = [""]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[str]:
    from tests.conftest import drop_namespace

    database = request.getfixturevalue("database")
    namespace = "t_fuzz_" + tmp_path_factory.mktemp("fuzz").name[-6:].replace("-", "_")
    base = Settings(
        database_url=database.conninfo,
        namespace=namespace,
        data_dir=tmp_path_factory.mktemp("data"),
    )
    app = create_app(base, role="all", options=replace(FAST, min_position_timeout=3.0))
    try:
        with live_server(app) as url:
            _BASE[0], _NAMESPACE[0] = url, namespace
            yield url
    finally:
        drop_namespace(database, namespace)


@pytest.fixture(scope="module")
def api_schema(live: str) -> Any:
    return schemathesis.openapi.from_url(f"{live}/openapi.json")


def test_the_api_honours_its_own_schema(api_schema: Any, live: str, tally: Tally) -> None:
    # Hypothesis directly (not the schemathesis pytest plugin, whose lazy
    # fixture loader does not support this pytest): every operation, valid
    # and invalid data, a bounded number of examples each; then valid data
    # again against a session and turn that exist, since random ids only
    # ever reach the 404 path.
    existing = _a_session_with_a_turn(live)
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 15
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _exercise(operation, mode, tally)
    # Closing the session ends what the others can do with it: it goes last.
    for operation in sorted(operations, key=lambda o: o.path.endswith("/close")):
        names = {p.name for p in operation.path_parameters}
        if "session_id" in names:
            ids = {k: v for k, v in existing.items() if k in names}
            _exercise(operation, GenerationMode.POSITIVE, tally, ids)
    assert tally.writes_by_refused == []  # a refused request changed nothing
    assert tally.refused > 0


def _a_session_with_a_turn(live: str) -> dict[str, str]:
    session = httpx.post(f"{live}/v1/sessions", json={}, timeout=10).json()
    turn = httpx.post(
        f"{live}/v1/sessions/{session['session_id']}/turns?wait=30",
        json={"message": '/tool echo {"text": "x"}'},
        timeout=40,
    ).json()
    assert turn["state"] == "completed", turn
    return {
        "session_id": session["session_id"],
        "turn_id": turn["turn_id"],
        "call_id": turn["tool_calls"][0]["call_id"],
    }


def _exercise(
    operation: Any, mode: GenerationMode, tally: Tally, ids: dict[str, str] | None = None
) -> None:
    strategy = operation.as_strategy(generation_mode=mode, path_parameters=ids)

    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def check(case: Any) -> None:
        tally.call(case, lambda response: case.validate_response(response, checks=CHECKS))

    try:
        check()
    except Unsatisfiable:
        # No invalid input exists for an operation without parameters or body.
        assert mode is GenerationMode.NEGATIVE, operation.label


def test_chained_requests_honour_the_schema_and_refusals_change_nothing(
    api_schema: Any, tally: Tally
) -> None:
    """Stateful: operations chained through inferred links, with the same checks."""
    machine = api_schema.as_state_machine()

    class Workflow(machine):  # type: ignore[misc,valid-type]
        def step(self, input: Any) -> Any:
            from schemathesis.generation.stateful.state_machine import StepOutput

            outputs: list[Any] = []

            def check(response: Any) -> None:
                outputs.append(response)
                self.after_call(response, input.case)
                input.case.validate_response(response, checks=CHECKS)

            tally.call(input.case, check)
            return StepOutput(outputs[0], input.case)

    before = tally.sent
    Workflow.run(
        settings=settings(
            max_examples=max(5, EXAMPLES // 2),
            stateful_step_count=10,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            phases=[Phase.generate],
        )
    )
    assert tally.sent - before >= max(5, EXAMPLES // 2)
    assert tally.writes_by_refused == []


def test_zz_the_requests_sent_are_counted(tally: Tally) -> None:
    """Runs last in this module: how many requests the fuzzing sent (at least 2,000 in chaos)."""
    print(f"schemathesis sent {tally.sent} requests, {tally.refused} refused")
    minimum = int(os.environ.get("TURNLOG_FUZZ_MIN_REQUESTS", "0"))
    assert tally.sent >= minimum
