"""A session view arranged for reading: each turn's steps with their tool calls, in order."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from turnlog.application.sessions import Sessions
from turnlog.application.views import describe_session_summary, describe_turn
from turnlog.domain.session import Session
from turnlog.domain.turns import Turn
from turnlog.interface.console.render import parse_time
from turnlog.projections.queries import decode_cursor, encode_cursor

# The live part of a timeline shows at most this many turns: a page left open
# while a session runs keeps every turn that arrived, up to this bound.
MAX_LIVE_TURNS = 200


def latest_turns(
    sessions: Sessions, session_id: UUID, limit: int, since: int | None, now: datetime
) -> dict[str, Any]:
    """A session's header and its latest turns: one page of ``Sessions.turn_page``.

    ``limit`` turns from the newest; with ``since``, every turn numbered from
    ``since`` on instead (at most ``MAX_LIVE_TURNS``), so a page that follows
    the session live keeps the turns it showed. Earlier turns are paged with
    ``earlier_turns`` by the cursor this returns (``next_cursor``).
    """
    if since is not None:
        limit = sessions.get_session(session_id).turn_count - since + 1
    limit = min(max(limit, 1), MAX_LIVE_TURNS)
    session, page, following = sessions.turn_page(session_id, None, limit)
    turns = _shaped(session, page, session.turn_count, now)
    blocking = next((t for t in turns if t["state"] == "interrupted"), None)
    return {
        **describe_session_summary(session),
        "turns": turns,
        "blocking_turn": blocking,
        "low": turns[0]["number"] if turns else 0,
        "next_cursor": encode_cursor("turns", (following,)) if following else None,
    }


def earlier_turns(
    sessions: Sessions, session_id: UUID, cursor: str, limit: int, now: datetime
) -> dict[str, Any]:
    """The page of turns before ``cursor`` (a cursor of ``GET /v1/sessions/{id}/turns``)."""
    key = decode_cursor(cursor, "turns", (int,))
    before = int(key[0]) if key else None
    session, page, following = sessions.turn_page(session_id, before, limit)
    top = session.turn_count if before is None else min(before - 1, session.turn_count)
    turns = _shaped(session, page, top, now)
    return {
        "turns": turns,
        "low": turns[0]["number"] if turns else 0,
        "next_cursor": encode_cursor("turns", (following,)) if following else None,
    }


def _shaped(
    session: Session, page: list[tuple[Session, Turn]], top: int, now: datetime
) -> list[dict[str, Any]]:
    """A page (newest first, the newest numbered ``top``) shaped oldest first, with the
    version range of each turn's events, for its raw-events panel."""
    shaped = []
    for offset, (record, turn) in enumerate(page):
        finished = record.finished_turn(turn.turn_id)
        last = finished.last_version if finished is not None else session.version
        view = shape_turn(top - offset, describe_turn(record, turn), now)
        shaped.append(
            {
                **view,
                "first_version": turn.first_version,
                "last_version": last,
                "is_open": turn.state.is_open,
            }
        )
    shaped.reverse()
    return shaped


def shape_turn(number: int, turn: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A turn with its number, each model step holding the tool calls it asked for,
    and the calls whose outcome is unknown listed apart."""
    calls = [shape_call(call, now) for call in turn["tool_calls"]]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for call in calls:
        by_step.setdefault(call["step"], []).append(call)
    steps = [{**step, "calls": by_step.pop(step["step"], [])} for step in turn["steps"]]
    return {
        **turn,
        "number": number,
        "steps": steps,
        # A call whose step has no recorded reply cannot happen; never hide one if it does.
        "other_calls": [call for rest in by_step.values() for call in rest],
        "tool_calls": calls,
        "unknown_calls": [c for c in calls if c["call_id"] in turn["unknown_call_ids"]],
    }


def shape_call(call: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A call with how long it took (or has been running so far)."""
    started = parse_time(call["started_at"])
    finished = parse_time(call["finished_at"])
    took = (finished - started).total_seconds() if started and finished else None
    running = (now - started).total_seconds() if started and not finished else None
    return {**call, "duration_seconds": took, "running_seconds": running}
