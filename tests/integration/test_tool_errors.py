"""A failing tool's error leaves the process short and without host paths; its log is bounded."""

from __future__ import annotations

import json
import logging
from typing import Any

import psycopg
import pytest
from psycopg import sql

from turnlog.application.runtime import Runtime
from turnlog.application.store.database import Database
from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.errors import MAX_ERROR_CHARS, MAX_LOG_CHARS
from turnlog.application.tools.port import FunctionTool, ToolSpec
from turnlog.domain.turns import Effect


def _chain(context: ToolContext, links: int) -> None:
    """Raise a chain of ``links`` exceptions, each naming a file in the sandbox by its path."""
    try:
        raise OSError(36, "File name too long", str(context.sandbox / ("n" * 300)))
    except OSError as first:
        error: BaseException = first
    for link in range(links - 1):
        try:
            raise RuntimeError(f"link {link} under {context.sandbox}") from error
        except RuntimeError as exc:
            error = exc
    raise error


def _tool(name: str, function: Any) -> FunctionTool:
    spec = ToolSpec(name, "fails", {"type": "object", "properties": {}}, Effect.READ_ONLY)
    return FunctionTool(spec, function)


def _failed_error(database: Database, runtime: Runtime, session_id: Any) -> str:
    """The error of the session's ToolCallFailed event, from the raw stored payload."""
    query = sql.SQL("SELECT topic, state FROM {} WHERE originator_id = %s").format(
        sql.Identifier(runtime.settings.schema_name, "sessions_events")
    )
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        rows = conn.execute(query, (session_id,)).fetchall()
    [state] = [bytes(r[1]) for r in rows if ".ToolCallFailed." in r[0]]
    return str(json.loads(state)["error"])


@pytest.mark.parametrize("links", [1, 979])
def test_a_tool_error_is_stored_short_without_the_data_directory_and_logged_bounded(
    runtime: Runtime, database: Database, caplog: pytest.LogCaptureFixture, links: int
) -> None:
    runtime.executor.tools.add(_tool("explode", lambda a, c: _chain(c, links)))
    session_id = runtime.sessions.create_session().session_id
    caplog.set_level(logging.WARNING, logger="turnlog.execution")

    runtime.send(session_id, "/tool explode {}")

    error = _failed_error(database, runtime, session_id)
    data_dir = str(runtime.settings.data_dir.resolve())
    assert data_dir not in error and str(runtime.settings.sandbox_root) not in error
    assert "<sandbox>" in error
    assert len(error) <= MAX_ERROR_CHARS
    records = [r for r in caplog.records if r.name == "turnlog.execution"]
    raised = [r for r in records if r.getMessage().startswith("tool raised")]
    assert raised and all(len(r.getMessage()) <= MAX_LOG_CHARS + 100 for r in raised)
    assert all(r.exc_info is None for r in raised)
