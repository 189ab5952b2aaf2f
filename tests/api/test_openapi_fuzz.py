"""Schemathesis against the live /openapi.json: no 5xx, no response that breaks the schema.

The server runs for real (uvicorn on a loopback port, role ``all`` so that
turns complete). It runs without a token, so the schema declares no
security and negative cases are judged on their own data (auth is tested
in test_security_api). Examples per operation are bounded so the whole run
stays well within a minute.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
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

from application.settings import Settings
from interface.http import create_app
from tests.api.conftest import FAST, live_server

EXAMPLES = 20
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


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
            yield url
    finally:
        drop_namespace(database, namespace)


@pytest.fixture(scope="module")
def api_schema(live: str) -> Any:
    return schemathesis.openapi.from_url(f"{live}/openapi.json")


def test_the_api_honours_its_own_schema(api_schema: Any, live: str) -> None:
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
            _exercise(operation, mode, live)
    # Closing the session ends what the others can do with it: it goes last.
    for operation in sorted(operations, key=lambda o: o.path.endswith("/close")):
        names = {p.name for p in operation.path_parameters}
        if "session_id" in names:
            ids = {k: v for k, v in existing.items() if k in names}
            _exercise(operation, GenerationMode.POSITIVE, live, ids)


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
    operation: Any, mode: GenerationMode, live: str, ids: dict[str, str] | None = None
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
        case.call_and_validate(base_url=live, checks=CHECKS, timeout=70)

    try:
        check()
    except Unsatisfiable:
        # No invalid input exists for an operation without parameters or body.
        assert mode is GenerationMode.NEGATIVE, operation.label
