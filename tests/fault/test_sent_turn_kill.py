"""`sessions send` SIGKILLed after its submission and claim were saved together."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from tests.conftest import raw_events, turnlog
from tests.deadlines import fault_window
from tests.fault.test_unfinished_tool_call import kill_mid_tool, new_session, show
from turnlog.application.settings import Settings, schema_name
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault


def transactions(database: Database, settings: Settings, session_id: str) -> list[int]:
    """The id of the transaction that wrote each event of the session, in version order."""
    query = sql.SQL(
        "SELECT xact_id::text FROM {}.sessions_events WHERE originator_id = %s"
        " ORDER BY originator_version"
    ).format(sql.Identifier(schema_name(settings.namespace)))
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        return [int(row[0]) for row in conn.execute(query, (session_id,)).fetchall()]


def test_a_turn_claimed_with_its_submission_is_resumed_by_the_next_send(
    settings: Settings, database: Database
) -> None:
    session_id = new_session(settings)
    # The model step lasts long enough for the kill to land inside it.
    slow = f"/slow {fault_window(3)} hello"
    kill_mid_tool(settings, database, session_id, slow, topic="TurnClaimed")
    stored = [r[3].split(".")[2] for r in raw_events(database, settings.namespace, session_id)]
    assert stored == ["SessionStarted", "TurnSubmitted", "TurnClaimed"]
    assert len(set(transactions(database, settings, session_id)[1:])) == 1  # one save, whole

    again = turnlog(settings, "sessions", "send", session_id, "hello again")
    assert again.returncode == 0, again.stderr
    turns = show(settings, session_id)["turns"]
    assert [(t["state"], t["claim"]) for t in turns] == [("completed", 2), ("completed", 1)]
    assert turns[0]["steps"][-1]["text"] == "Echo: hello"  # the model was asked again
    assert turns[1]["steps"][-1]["text"] == "Echo: hello again"
