"""Plain-data views of a session rebuilt from its events (for the CLI and HTTP)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from turnlog.domain.request import ModelRequest
from turnlog.domain.session import Session
from turnlog.domain.turns import ToolCall, Turn


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def describe_call(call: ToolCall) -> dict[str, Any]:
    return {
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
        "step": call.step,
        "state": str(call.state),
        "effect": call.effect,
        "attempt": call.attempt,
        "worker_id": call.worker_id,
        "started_at": _iso(call.started_at),
        "finished_at": _iso(call.finished_at),
        "result": call.result,
        "error": call.error,
        "outcome": call.outcome,
        "note": call.note,
        "actor": call.actor,
        "processes": [dict(p) for p in call.processes],
        "approval": call.approval,
        "proposed_arguments": call.proposed_arguments,
        "pre_state": dict(call.pre_state),
        "probes": [dict(p) for p in call.probes],
        "evidence": dict(call.evidence),
    }


def describe_turn(session: Session, turn: Turn) -> dict[str, Any]:
    return {
        "turn_id": turn.turn_id,
        "state": str(turn.state),
        "message": turn.message,
        "reply": turn.reply,
        "error": turn.error,
        "idempotency_key": turn.idempotency_key,
        "submitted_at": _iso(turn.submitted_at),
        "state_since": _iso(turn.state_since),
        "claim": turn.claim,
        "worker_id": turn.worker_id,
        "previous_worker": turn.previous_worker,
        "interrupted_by": turn.interrupted_by,
        "reason": turn.reason,
        "actor": turn.actor,
        "steps": [
            {"step": s.step, "text": s.text, "call_ids": list(s.call_ids), "usage": s.usage}
            for s in turn.steps
        ],
        "tool_calls": [describe_call(c) for c in session.calls_of(turn)],
        "unknown_call_ids": [c.call_id for c in session.unknown_calls(turn)],
        "deadline_at": _iso(turn.deadline_at),
        "cancel_reason": turn.cancel_reason,
        "cancel_force": turn.cancel_force,
    }


def describe_session(session: Session) -> dict[str, Any]:
    return {
        "session_id": str(session.id),
        "title": session.title,
        "status": session.status,
        "provider": session.provider,
        "model": session.model,
        "tools": list(session.tools),
        "metadata": session.metadata,
        "created_by": session.created_by,
        "created_at": _iso(session.created_on),
        "last_activity_at": _iso(session.modified_on),
        "version": session.version,
        "closed": session.closed,
        "context": {
            "max_turns": session.context_max_turns or None,
            "max_chars": session.context_max_chars or None,
        },
        "compaction": describe_compaction(session.compaction),
        "approval_policy": session.approval_policy,
        "deadline_seconds": session.deadline_seconds or None,
        "turns": [describe_turn(session, t) for t in session.turns],
    }


def describe_session_summary(session: Session) -> dict[str, Any]:
    """A session's settings, status, turn counts and open turn: bounded whatever its length.

    The turns themselves are paged (``Sessions.turn_page``).
    """
    view = describe_session(session)
    del view["turns"]
    last = session.last_turn
    counts = dict(session.counts)
    open_turn = session.open_turn
    for turn in session.turns:
        if turn.state.is_open:
            counts[str(turn.state)] = counts.get(str(turn.state), 0) + 1
    return {
        **view,
        "turn_count": session.turn_count,
        "turn_counts": counts,
        "last_turn": None if last is None else {"turn_id": last.turn_id, "state": str(last.state)},
        "open_turn": None if open_turn is None else describe_turn(session, open_turn),
        "forked_from": session.forked_from,
        "queued_turns": [
            {
                "turn_id": t.turn_id,
                "message": t.message,
                "submitted_at": _iso(t.submitted_at),
                "deadline_at": _iso(t.deadline_at),
            }
            for t in session.queued_turns()
        ],
    }


def describe_compaction(compaction: dict[str, Any] | None) -> dict[str, Any] | None:
    """The latest context summary: its text, how many turns it covers, where it is."""
    if not compaction:
        return None
    return {
        "summary": compaction["summary"],
        "turns": compaction["turns"],
        "last_turn_id": compaction["last_turn_id"],
        "version": compaction["version"],
    }


def describe_request(session_id: UUID, version: int, request: ModelRequest) -> dict[str, Any]:
    """A model request as built at a session's version (``Sessions.request_at``)."""
    return {
        "session_id": str(session_id),
        "version": version,
        "provider": request.provider,
        "model": request.model,
        "turn": request.turn,
        "tools": list(request.tools),
        "tools_chosen": request.tools_chosen,
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "tool_calls": [dict(c) for c in m.tool_calls],
                "tool_call_id": m.tool_call_id,
                "name": m.name,
            }
            for m in request.messages
        ],
    }
