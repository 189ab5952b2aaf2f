"""A turn that fails unexpectedly on every attempt must not be retried in a hot loop.

Each retry claims the turn again, which is an event: a worker that retook a
crashing turn at once wrote hundreds of TurnClaimed events a second, without
end. Now a worker pauses before retrying such a turn (1, 2, 4 … 60 s).
"""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from tests.conftest import raw_events
from tests.fault.cluster import poll
from turnlog.application.providers.port import FixtureProvider, ModelReply, ProviderRegistry
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.domain.request import ModelRequest
from turnlog.interface.http import create_app


class CrashingProvider:
    """A provider with a bug: it raises something that is not a ProviderError."""

    name = "crashing"

    def complete(self, request: ModelRequest) -> ModelReply:
        raise RuntimeError("a bug in the provider")


def test_a_turn_that_crashes_on_every_attempt_is_retried_with_pauses_not_in_a_loop(
    settings: Settings, runtime: Runtime
) -> None:
    app = create_app(settings, role="all", worker_concurrency=2)
    with TestClient(app, raise_server_exceptions=False) as client:
        served = app.state.turnlog.process.runtime  # the runtime the app's worker runs turns with
        served.executor.providers = ProviderRegistry(
            [FixtureProvider(), CrashingProvider()], default="fixture"
        )
        sid = client.post("/v1/sessions", json={"provider": "crashing"}).json()["session_id"]
        assert client.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"}).status_code == 202

        def claims() -> int:
            return [r[3] for r in raw_events_of(settings, runtime, sid)].count("TurnClaimed")

        poll(lambda: claims() >= 1, 20, "a first claim")
        time.sleep(2.5)  # watching what happens over a while: no condition to wait for
        assert claims() <= 3  # 1 s then 2 s pauses; it was ~25 claims a second
        assert client.get("/healthz").status_code == 200


def raw_events_of(settings: Settings, runtime: Runtime, sid: str) -> list[tuple[str, ...]]:
    rows = raw_events(runtime.db, settings.namespace, sid)
    return [(r[0], r[1], r[2], r[3].split(".")[2]) for r in rows]
