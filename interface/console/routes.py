"""The console's routes: open page shells, and data fragments behind the /v1 guards.

A browser navigation cannot carry an ``Authorization`` header, so the pages
(``/console``, ``/console/sessions/{id}``, ``/console/overview``) are shells:
layout, forms and the script, and not one byte of session data. The data
comes as HTML fragments (``/console/fragments/...``) rendered by the same
templates, behind exactly the guards of /v1 (the bearer token when one is
set, no unknown query parameters); the script fetches them with the token it
keeps in sessionStorage. Raw events, the live stream and the operator's
actions use the /v1 endpoints themselves.

Refusals are problems like everywhere else (``interface.problems``); the
script shows their ``detail``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.params import Depends
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from turnlog.interface.console.board import build_board
from turnlog.interface.console.listing import FILTERS, sessions_page
from turnlog.interface.console.render import STATIC, templates
from turnlog.interface.console.timeline import earlier_turns, latest_turns
from turnlog.interface.http.deps import ReadModelsDep, RuntimeDep, SessionsDep

TEMPLATES = templates()

# No inline script or style anywhere, so the policy can forbid both: a value
# that slipped past escaping still could not run.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

pages = APIRouter(prefix="/console", include_in_schema=False)
fragments = APIRouter(prefix="/console/fragments", include_in_schema=False)


def install(app: FastAPI, guards: Sequence[Depends]) -> None:
    """Serve the console on ``app``: shells and static files open, fragments behind ``guards``."""
    app.include_router(pages)
    app.include_router(fragments, dependencies=list(guards))
    app.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")


def _render(request: Request, name: str, **context: Any) -> HTMLResponse:
    # Every page says when tool processes run unconfined (TURNLOG_SANDBOX=off).
    context["sandbox_off"] = request.app.state.turnlog.process.settings.sandbox == "off"
    return TEMPLATES.TemplateResponse(request, name, context, headers=HEADERS)


# ------------------------------------------------------------------- pages


@pages.get("/", response_class=RedirectResponse)
def console_root() -> RedirectResponse:
    return RedirectResponse("/console", status_code=308)


@pages.get("", response_class=HTMLResponse)
def sessions_shell(request: Request) -> HTMLResponse:
    """The sessions list (the filter and page are read by the script from the URL)."""
    return _render(request, "sessions.html", page="sessions", filters=FILTERS)


@pages.get("/sessions/{session_id}", response_class=HTMLResponse)
def session_shell(request: Request, session_id: UUID) -> HTMLResponse:
    """A session's timeline. Whether the session exists is told only with the token."""
    return _render(request, "session.html", page="session", session_id=str(session_id))


@pages.get("/overview", response_class=HTMLResponse)
def overview_shell(request: Request) -> HTMLResponse:
    return _render(request, "overview.html", page="overview")


# --------------------------------------------------------------- fragments


@fragments.get("/sessions", response_class=HTMLResponse)
async def sessions_fragment(
    request: Request,
    read_models: ReadModelsDep,
    show: Literal["idle", "busy", "blocked", "awaiting_approval", "closed", "attention", ""] = "",
    limit: Annotated[int, Query(ge=1, le=100)] = 25,
    cursor: Annotated[str | None, Query(max_length=600)] = None,
    q: Annotated[str, Query(max_length=200)] = "",
) -> HTMLResponse:
    """A page of the sessions table; ``q`` searches by id prefix or title instead."""
    rows, following = await run_in_threadpool(sessions_page, read_models, show, limit, cursor, q)
    return _render(
        request,
        "fragments/sessions.html",
        rows=rows,
        next_cursor=following,
        show=show,
        search=q.strip(),
        now=datetime.now(UTC),
    )


@fragments.get("/sessions/{session_id}/timeline", response_class=HTMLResponse)
def timeline_fragment(
    request: Request,
    session_id: UUID,
    sessions: SessionsDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
    since: Annotated[int | None, Query(ge=1, le=2**62)] = None,
) -> HTMLResponse:
    """The session and its latest ``limit`` turns, or every turn from number ``since``
    (404 for an unknown session). Earlier turns: the ``turns`` fragment."""
    now = datetime.now(UTC)
    session = latest_turns(sessions, session_id, limit, since, now)
    return _render(request, "fragments/timeline.html", s=session, now=now, page_only=False)


@fragments.get("/sessions/{session_id}/turns", response_class=HTMLResponse)
def turns_fragment(
    request: Request,
    session_id: UUID,
    sessions: SessionsDep,
    cursor: Annotated[str, Query(min_length=1, max_length=200)],
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
) -> HTMLResponse:
    """The page of turns before ``cursor`` ("load earlier turns"), oldest first; the
    cursor is that of ``GET /v1/sessions/{id}/turns``."""
    now = datetime.now(UTC)
    page = earlier_turns(sessions, session_id, cursor, limit, now)
    return _render(request, "fragments/timeline.html", s=page, now=now, page_only=True)


@fragments.get("/overview", response_class=HTMLResponse)
def overview_fragment(
    request: Request, runtime: RuntimeDep, read_models: ReadModelsDep
) -> HTMLResponse:
    """The status board."""
    return _render(
        request,
        "fragments/overview.html",
        board=build_board(runtime, read_models),
        now=datetime.now(UTC),
    )
