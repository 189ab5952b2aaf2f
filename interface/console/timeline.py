"""A session view arranged for reading: each turn's steps with their tool calls, in order."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from turnlog.interface.console.render import parse_time


def shape_session(view: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """``application.views.describe_session`` output, with turns shaped by ``shape_turn``.

    ``blocking_turn`` is the interrupted turn that blocks the session, if any.
    """
    now = now or datetime.now(UTC)
    turns = [shape_turn(number, turn, now) for number, turn in enumerate(view["turns"], 1)]
    blocking = next((t for t in turns if t["state"] == "interrupted"), None)
    return {**view, "turns": turns, "blocking_turn": blocking}


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
