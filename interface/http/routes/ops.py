"""Operations: liveness, readiness, metrics. Never behind the token."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from turnlog.interface.bootstrap import sandbox_state
from turnlog.interface.http.deps import StateDep
from turnlog.interface.http.schemas import HealthOut, ReadyOut, problems
from turnlog.interface.http.tenancy import Tenancy
from turnlog.interface.problems import NotReady

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> HealthOut:
    """Liveness: the process answers."""
    return HealthOut(status="ok")


@router.get("/readyz", response_model=ReadyOut, responses=problems(503))
def readyz(state: StateDep, request: Request) -> ReadyOut:
    """Readiness: started, the database answers, and this process's worker and
    projection runners (if its role runs them) are up; with a tenants file, in
    every namespace it serves (a check fails if it fails in one)."""
    tenancy: Tenancy = request.app.state.tenancy
    checks: dict[str, bool] = {}
    for _, one in tenancy.all():
        these = one.process.checks()
        these["database"] = _database_answers(one)
        for name, ok in these.items():
            checks[name] = checks.get(name, True) and ok
    checks["accepting"] = not state.draining.is_set()
    horizon = _horizon(state) if checks["database"] else None
    if not all(checks.values()):
        failing = ", ".join(k for k, ok in checks.items() if not ok)
        raise NotReady(f"not ready: {failing}", checks=checks, horizon=horizon)
    return ReadyOut(
        status="ready",
        role=str(state.process.role),
        checks=checks,
        sandbox=sandbox_state(state.process.settings),
        horizon=horizon,
    )


def _horizon(state: StateDep) -> dict[str, Any] | None:
    """The commit horizon's age and holder (detail only: a held horizon delays, it is not down)."""
    read_models = state.process.read_models
    if read_models is None:
        return None
    try:
        found = read_models.events.horizon()
    except Exception:
        return None
    return {k: found[k] for k in ("age_seconds", "pid", "database", "application_name")}


def _database_answers(state: StateDep) -> bool:
    runtime = state.process.runtime
    if runtime is None:
        return False
    try:
        with psycopg.connect(runtime.db.conninfo, connect_timeout=2, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
def metrics(request: Request) -> Response:
    """Prometheus metrics: requests, turn and tool-call outcomes, open turns, projection lag.

    With a tenants file, every sample carries the ``namespace`` it counts."""
    tenancy: Tenancy = request.app.state.tenancy
    return Response(tenancy.render_metrics(), media_type=CONTENT_TYPE_LATEST)
