"""Domain errors: a rule of the Session aggregate refused a command.

Every error has a stable ``code`` that the interface maps to a status or an
exit code. The tree::

    DomainError
    ├── InvalidInput                 (422) the command's own input is malformed
    │   ├── InvalidMessage
    │   ├── InvalidOperatorAction
    │   ├── InvalidContextPolicy
    │   ├── InvalidSummary
    │   ├── InvalidDeadline
    │   └── InvalidApprovalPolicy
    ├── NotFound                     (404)
    │   ├── TurnNotFound
    │   └── ToolCallNotFound
    └── Conflict                     (409) the session's state forbids the command
        ├── TurnInProgress
        ├── UnresolvedTurn
        ├── SessionClosed
        ├── StaleClaim
        ├── InvalidTransition
        ├── DuplicateToolCall
        ├── IdempotencyKeyReused
        ├── TurnFinished
        ├── CallNotProposed
        ├── QueueFull
        ├── ForkInsideTurn
        └── ForkAtInterruptedTurn
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class DomainError(Exception):
    """Base of every error raised by a rule of the domain."""

    code = "domain_error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra: dict[str, Any] = extra


class InvalidInput(DomainError):
    """The command's input is malformed (empty, too large, wrong shape)."""

    code = "invalid_input"


class InvalidMessage(InvalidInput):
    """A user message is empty or larger than the limit."""

    code = "invalid_message"


class InvalidOperatorAction(InvalidInput):
    """An operator action lacks its actor or reason, or names a bad outcome."""

    code = "invalid_operator_action"


class InvalidContextPolicy(InvalidInput):
    """A session's context-window policy is out of range (max_turns < 1, max_chars < 1000)."""

    code = "invalid_context_policy"


class InvalidSummary(InvalidInput):
    """A context summary is empty or larger than the message size limit."""

    code = "invalid_summary"


class InvalidDeadline(InvalidInput):
    """A turn's deadline is not a positive number of seconds within the limit."""

    code = "invalid_deadline"


class InvalidApprovalPolicy(InvalidInput):
    """A session's approval policy is not one of none, side_effecting, all."""

    code = "invalid_approval_policy"


class NotFound(DomainError):
    """Something named inside a session does not exist."""

    code = "not_found"


class TurnNotFound(NotFound):
    """The session has no turn with that id."""

    code = "turn_not_found"


class ToolCallNotFound(NotFound):
    """The session has no tool call with that id."""

    code = "tool_call_not_found"


class Conflict(DomainError):
    """The session's current state does not allow the command."""

    code = "conflict"


class TurnInProgress(Conflict):
    """A new turn was submitted while the last one is queued or running."""

    code = "turn_in_progress"


class UnresolvedTurn(Conflict):
    """A new turn was submitted while the last one is interrupted."""

    code = "unresolved_turn"

    def __init__(self, detail: str, turn_id: str, unknown_calls: Sequence[dict[str, Any]]):
        super().__init__(detail, turn_id=turn_id, unknown_calls=list(unknown_calls))
        self.turn_id = turn_id
        self.unknown_calls = list(unknown_calls)


class SessionClosed(Conflict):
    """The session is closed and takes no more turns."""

    code = "session_closed"


class StaleClaim(Conflict):
    """A step was recorded under a claim that is no longer the turn's current one."""

    code = "stale_claim"


class InvalidTransition(Conflict):
    """The turn or tool call is not in a state that allows this step."""

    code = "invalid_transition"


class DuplicateToolCall(Conflict):
    """A model reply reused a tool call id already used in this session."""

    code = "duplicate_tool_call"


class IdempotencyKeyReused(Conflict):
    """An idempotency key already used in the session came with a different message."""

    code = "idempotency_key_reused"


class TurnFinished(Conflict):
    """An action (a cancel) names a turn that has already finished."""

    code = "turn_finished"


class CancelPending(Conflict):
    """A tool call would start in a turn whose cancel is already on record."""

    code = "cancel_pending"


class CallNotProposed(Conflict):
    """An approval or rejection names a tool call that is not waiting for one."""

    code = "call_not_proposed"


class QueueFull(Conflict):
    """A follow-up turn was enqueued while the session already holds the most it may queue."""

    code = "queue_full"


class ForkInsideTurn(Conflict):
    """A fork names a version at which a turn was still queued, running or awaiting approval."""

    code = "fork_inside_turn"


class ForkAtInterruptedTurn(Conflict):
    """A fork names a version at which a turn was interrupted (a call's outcome unknown)."""

    code = "fork_at_interrupted_turn"
