"""The earlier turns a request carries, built from what this process saved, equal a fresh read."""

from __future__ import annotations

from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.interface.bootstrap import build_runtime


def test_requests_built_from_saved_events_equal_those_of_a_fresh_process(
    runtime: Runtime, settings: Settings
) -> None:
    session_id = runtime.sessions.create_session(tools=["echo"]).session_id
    other = build_runtime(settings)  # another process writing to the same session
    try:
        for n in range(6):
            message = f'/tool echo {{"text": "turn {n}"}}' if n % 2 else f"The codeword is c{n}"
            if n == 3:  # a turn saved elsewhere: this process must read it, not assume it
                other.send(session_id, message)
                continue
            assert runtime.send(session_id, message).turn.state == "completed"
            fresh = build_runtime(settings)
            try:
                mine = runtime.sessions.request_for(runtime.sessions.get_session(session_id))
                theirs = fresh.sessions.request_for(fresh.sessions.get_session(session_id))
            finally:
                fresh.close()
            assert mine == theirs
            assert len(mine.messages) > 2 * n
    finally:
        other.close()
