"""Which saves must be on disk before the next step, and which may ride on the next flush.

The promise rests on some of a turn's steps, not on all of them
(docs/durability.md). A save *rides* when losing it in a crash of the
database costs nothing but repeated work; its commit need not wait for the
disk, because the next durable commit (PostgreSQL's WAL is one sequence)
flushes it too. A save rides only when every event in it is one of:

- ``TurnClaimed``: lost, the turn is open again and is claimed again;
- ``ModelReplied`` asking for tools: lost, the model is asked again;
- the outcome (``ToolCallSucceeded``, ``ToolCallFailed``) of a call that is
  safe to repeat (read-only or idempotent): lost, the stream ends at the
  call's intent, and recovery runs the call again, as after a process crash.

Everything else is durable before anyone acts on it: a submission (before
202), a call's intent (before the call runs) and the process it started, a
side-effecting call's outcome, a turn's end (before anyone is told), a
proposal, a decision, a summary, a close.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnlog.domain import events
from turnlog.domain.turns import Effect

_OUTCOMES = (events.ToolCallSucceeded, events.ToolCallFailed)


def may_ride(calls: dict[str, Any], pending: Sequence[object]) -> bool:
    """Whether a save of ``pending`` may be lost in a database crash at no cost but repeated work.

    ``calls``: the session's tool calls by id, with the pending events applied
    (a call's effect is recorded by its intent, ``ToolCallStarted``).
    """
    return bool(pending) and all(_may_ride(calls, event) for event in pending)


def _may_ride(calls: dict[str, Any], event: object) -> bool:
    if isinstance(event, events.TurnClaimed):
        return True
    if isinstance(event, events.ModelReplied):
        return bool(event.tool_calls)
    if isinstance(event, _OUTCOMES):
        call = calls.get(event.call_id)
        return call is not None and _safe_to_repeat(call.effect)
    return False


def _safe_to_repeat(effect: str) -> bool:
    try:
        return Effect(effect).safe_to_repeat
    except ValueError:  # no effect recorded (older events) or one unknown here: durable
        return False
