"""`sessions send` SIGKILLed after its submission and claim were saved together."""

from __future__ import annotations

import pytest

from tests.conftest import raw_events, turnlog
from tests.deadlines import fault_window
from tests.fault.test_unfinished_tool_call import kill_mid_tool, new_session, show
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault


def test_a_turn_claimed_with_its_submission_is_resumed_by_the_next_send(
    settings: Settings, database: Database
) -> None:
    session_id = new_session(settings)
    # The model step lasts long enough for the kill to land inside it.
    slow = f"/slow {fault_window(3)} hello"
    kill_mid_tool(settings, database, session_id, slow, topic="TurnClaimed")
    stored = [r[3].split(".")[2] for r in raw_events(database, settings.namespace, session_id)]
    assert stored == ["SessionStarted", "TurnSubmitted", "TurnClaimed"]  # the one save, whole

    again = turnlog(settings, "sessions", "send", session_id, "hello again")
    assert again.returncode == 0, again.stderr
    turns = show(settings, session_id)["turns"]
    assert [(t["state"], t["claim"]) for t in turns] == [("completed", 2), ("completed", 1)]
    assert turns[0]["steps"][-1]["text"] == "Echo: hello"  # the model was asked again
    assert turns[1]["steps"][-1]["text"] == "Echo: hello again"
