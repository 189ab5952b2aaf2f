"""The FastAPI application factory.

``create_app(settings, role=...)`` wires the routes, the error handlers and
the middleware around a process built by ``interface.bootstrap``; its
lifespan starts the process and stops it on shutdown: uvicorn handles SIGTERM by
no longer accepting connections and finishing in-flight requests, then the
lifespan drains the worker, stops the projection runners and closes pools.

When the database cannot be reached at start-up, the server still comes up:
``/healthz`` answers, ``/readyz`` and ``/v1`` answer 503 with Retry-After,
and the start is retried in the background until it succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import threading
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from eventsourcing import persistence
from fastapi import Depends, FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi
from fastapi_offline import FastAPIOffline

from turnlog.application.errors import DatabaseUnavailable
from turnlog.application.purge import forget_purged
from turnlog.application.purge_watch import PurgeWatch
from turnlog.application.quotas import QuotaGate
from turnlog.application.settings import Settings
from turnlog.application.store.topics import PURGE_MARK
from turnlog.application.tenants import Quotas, Tenants, load_tenants, scoped_settings
from turnlog.interface import console
from turnlog.interface.bootstrap import build_process
from turnlog.interface.http import errors
from turnlog.interface.http.deps import database_fails_fast, known_query_only, require_token
from turnlog.interface.http.errors import PROBLEM_MEDIA_TYPE
from turnlog.interface.http.metrics import Metrics
from turnlog.interface.http.middleware import (
    BodyLimitMiddleware,
    MetricsMiddleware,
    RequestIdMiddleware,
    TokenMiddleware,
)
from turnlog.interface.http.routes import events, identity, listings, ops, purge, sessions, turns
from turnlog.interface.http.state import AppState, Options, StateCounts
from turnlog.interface.http.streams import StreamSlots
from turnlog.interface.http.tenancy import Tenancy
from turnlog.interface.metrics import RetentionCollector
from turnlog.interface.purging import retention_job
from turnlog.interface.roles import Role

log = logging.getLogger("turnlog.http")

_DB_DOWN = (DatabaseUnavailable, psycopg.OperationalError, persistence.OperationalError)


def create_app(
    settings: Settings,
    *,
    role: Role | str = Role.API,
    options: Options | None = None,
    worker_concurrency: int = 4,
) -> FastAPI:
    """The HTTP app of one process, which it builds, starts and stops.

    With ``TURNLOG_TENANTS_FILE`` it serves every namespace the file names, a
    process of parts for each (``interface.http.tenancy``); else the one of
    ``TURNLOG_NAMESPACE``.
    """
    role = Role(role)
    tenants = _tenants(settings)
    options = options or Options()
    streams = StreamSlots(options.max_streams)
    draining = threading.Event()
    states: dict[str, AppState] = {}
    for scoped in scoped_settings(settings, tenants):
        namespace = scoped.namespace
        process = build_process(scoped, role, worker_concurrency=worker_concurrency)
        state = AppState(process, options, streams, Metrics(process, streams), draining)
        process.observer = state.metrics.execution
        states[namespace] = state
    default = settings.namespace if settings.namespace in states else min(states)
    tenancy = Tenancy(states, default, settings.tenants_file, tenants)
    if tenants is not None:
        for namespace, state in states.items():
            state.quota = QuotaGate(
                namespace, functools.partial(_quotas_of, tenancy, namespace), StateCounts(state)
            )
    # /docs and /redoc load their scripts and styles from this package's own
    # files (fastapi-offline), not a CDN: the reference works without internet.
    app = FastAPIOffline(
        title="turnlog",
        version="1",
        summary="Agent sessions as event streams in PostgreSQL.",
        lifespan=_lifespan,
        static_url="/docs-assets",
    )
    app.state.turnlog = tenancy.state(None)
    app.state.tenancy = tenancy
    errors.install(app)
    # Added last runs first: request id → metrics → token → body limit → routing.
    # The token is checked before any body is read or parsed.
    app.add_middleware(BodyLimitMiddleware, limit=options.max_body_bytes)
    token = settings.api_token.get_secret_value() if settings.api_token is not None else None
    app.add_middleware(
        TokenMiddleware,
        token=token if role.serves_api else None,
        tenancy=tenancy if role.serves_api else None,
        routes=lambda: app.router.routes,
    )
    app.add_middleware(MetricsMiddleware, observe=tenancy.observe)
    app.add_middleware(RequestIdMiddleware)
    app.include_router(ops.router)
    if role.serves_api:
        # Security is declared (and documented) only when a token is configured.
        guards = [Depends(database_fails_fast), Depends(known_query_only)]
        if settings.api_token is not None or tenants is not None:
            guards.insert(0, Depends(require_token))
        for module in (sessions, turns, events, listings, purge, identity):
            app.include_router(module.router, dependencies=guards)
        console.install(app, guards)  # pages open, data behind the same guards
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _tenants(settings: Settings) -> Tenants | None:
    return None if settings.tenants_file is None else load_tenants(settings.tenants_file)


def _quotas_of(tenancy: Tenancy, namespace: str) -> Quotas:
    tenants = tenancy.tenants
    return tenants.quotas_of(namespace) if tenants is not None else Quotas()


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    tenancy: Tenancy = app.state.tenancy
    retries: list[asyncio.Task[None]] = []
    for namespace, state in tenancy.all():
        if not await _start(state):
            retries.append(
                asyncio.create_task(_keep_starting(state), name=f"turnlog-start-{namespace}")
            )
    reloading = _on_sighup(tenancy)
    try:
        yield
    finally:
        if reloading:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        for state in tenancy.states.values():
            state.draining.set()
        for retry in retries:
            retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retry
        for state in tenancy.states.values():
            await _stop(state)


def _on_sighup(tenancy: Tenancy) -> bool:
    """Re-read the tenants file on SIGHUP (only where the loop can take signals)."""
    if tenancy.path is None:
        return False
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, tenancy.reload)
    except (RuntimeError, ValueError, NotImplementedError):
        return False  # not the main thread (a test's client): reload() is called directly
    return True


async def _stop(state: AppState) -> None:
    state.waits.detach()
    state.waits.wake_all()  # every waiter re-checks and sees the shutdown
    for job in (state.retention, state.purges):
        if job is not None:
            await run_in_threadpool(job.stop)
    await run_in_threadpool(state.process.stop, state.options.drain_timeout)


async def _start(state: AppState) -> bool:
    """Start the parts; False (and remembered) when the database cannot be reached."""
    try:
        await run_in_threadpool(state.process.start)
    except _DB_DOWN as exc:
        state.start_error = exc
        log.warning("database unreachable at start-up, retrying: %s", exc)
        return False
    state.start_error = None
    runtime = state.process.runtime
    assert state.process.follower is not None and runtime is not None
    state.waits.attach(runtime.sessions.news, asyncio.get_running_loop())
    runtime.sessions.news.subscribe(forget_purged(runtime.sessions), PURGE_MARK)
    state.purges = PurgeWatch(runtime.sessions, runtime.db)
    state.purges.start()
    state.retention = retention_job(runtime, state.process.reads())
    if state.retention is not None:
        state.metrics.registry.register(RetentionCollector(state.retention.stats))
        state.retention.start()
    return True


async def _keep_starting(state: AppState) -> None:
    while not await _start(state):
        await asyncio.sleep(state.options.start_retry_seconds)
    log.info("started after the database became reachable")


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The generated schema, with problems documented as application/problem+json."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if status[:1] in ("4", "5") and "application/json" in content:
                    content[PROBLEM_MEDIA_TYPE] = content.pop("application/json")
    app.openapi_schema = schema
    return schema
