"""The pure function from a session to the next model request.

Every tool call the model ever made is answered in the request, so a
provider's rule that each call has a result always holds: calls whose
outcome is unknown or was given up get an explicit placeholder.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turnlog.domain.session import Session
from turnlog.domain.turns import RUNTIME_ACTOR, CallState, ToolCall, Turn, TurnState

PLACEHOLDER_UNKNOWN = "outcome unknown: the worker running this call stopped before it reported"
PLACEHOLDER_ABANDONED = "outcome unknown: abandoned by operator"
PLACEHOLDER_PROPOSED = "not run yet: waiting for an operator's approval"


@dataclass(frozen=True)
class Message:
    """One message of a model request (system, user, assistant or tool)."""

    role: str
    content: str
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str = ""
    name: str = ""


@dataclass(frozen=True)
class ModelRequest:
    """Everything a provider needs to produce the next reply."""

    provider: str
    model: str
    messages: tuple[Message, ...]
    tools: tuple[str, ...] = field(default_factory=tuple)
    # True: exactly ``tools`` (none when empty); False: an empty ``tools`` means every tool.
    tools_chosen: bool = False
    # The session's number of the turn the request is for (1: its first; 0: not said).
    turn: int = 0


def tool_result_text(call: ToolCall) -> str:
    """The content of the tool message that answers ``call``."""
    if call.state is CallState.SUCCEEDED:
        return _as_json(call.result)
    if call.state is CallState.FAILED:
        return f"error: {call.error}"
    if call.state is CallState.RESOLVED:
        prefix = "" if call.outcome == "succeeded" else "error: "
        if call.actor.startswith("probe:"):
            # Settled by the tool's probe after its owner died: the model is told so.
            return f"{prefix}{_as_json(call.result)} (outcome established by the tool's probe)"
        return f"{prefix}{_as_json(call.result)} (outcome recorded by operator: {call.note})"
    if call.state is CallState.ABANDONED:
        return PLACEHOLDER_ABANDONED
    if call.state is CallState.REJECTED:
        return f"rejected by operator: {call.note}"
    if call.state is CallState.CANCELLED:
        by = "by operator" if call.actor != RUNTIME_ACTOR else "by the runtime"
        return f"cancelled {by}: {call.note}"
    if call.state is CallState.PROPOSED:
        return PLACEHOLDER_PROPOSED
    return PLACEHOLDER_UNKNOWN


def next_request(session: Session, earlier: Session | None = None) -> ModelRequest:
    """Build the provider request from the session's state and its earlier turns.

    A session as the application loads it holds only its open turn; the
    finished turns the request carries come in ``earlier``: a retaining
    session rebuilt from those turns' own events (``Sessions.request_for``
    reads them from the stream by version range). A retaining session holds
    every turn itself and needs no ``earlier``.
    """
    messages: list[Message] = []
    if session.system_prompt:
        messages.append(Message("system", session.system_prompt))
    if session.compaction:
        # The latest context summary stands for every turn it covers; the
        # turns after it follow in full (``earlier`` holds only those).
        messages.append(summary_message(session.compaction))
    if earlier is not None:
        messages.extend(_earlier_messages(earlier))
    current = session.open_turn
    for turn in session.turns:
        if turn.state is TurnState.QUEUED and turn is not current:
            continue  # a follow-up queued behind the current turn: not said yet
        if not _unsaid(turn):
            messages.extend(_turn_messages(session, turn))
    return ModelRequest(
        provider=session.provider,
        model=session.model,
        messages=tuple(messages),
        tools=tuple(session.tools),
        tools_chosen=session.tools_chosen,
        turn=session.turn_count,
    )


# The messages of the leading finished turns of an ``earlier`` session object, per
# object: (its turns that are rendered, the last of them, their messages). A
# finished turn never changes and the object only gains turns (events applied in
# place), so the next request renders only the turns after them.
_prefixes: dict[int, tuple[weakref.ref[Session], int, Turn | None, tuple[Message, ...]]] = {}


def _earlier_messages(earlier: Session) -> list[Message]:
    """The messages of ``earlier``'s finished turns, in order (open ones are not said yet)."""
    turns, key = earlier.turns, id(earlier)
    hit = _prefixes.get(key)
    count, messages = 0, []
    same = hit is not None and hit[0]() is earlier and hit[1] <= len(turns)
    if hit is not None and same and (hit[1] == 0 or turns[hit[1] - 1] is hit[2]):
        count, messages = hit[1], list(hit[3])
    start = count
    while count < len(turns) and not turns[count].state.is_open:  # the prefix grows
        if not _unsaid(turns[count]):
            messages.extend(_turn_messages(earlier, turns[count]))
        count += 1
    if count != start or not same:
        last = turns[count - 1] if count else None
        _prefixes[key] = (weakref.ref(earlier, _forget_prefix(key)), count, last, tuple(messages))
    for turn in turns[count:]:  # after an open turn: rendered each time
        if not turn.state.is_open and not _unsaid(turn):
            messages.extend(_turn_messages(earlier, turn))
    return messages


def _forget_prefix(key: int) -> Callable[[weakref.ref[Session]], None]:
    def forget(_: weakref.ref[Session]) -> None:
        _prefixes.pop(key, None)

    return forget


def _unsaid(turn: Turn) -> bool:
    """A turn cancelled before the model answered it: the model is told nothing of it.

    A follow-up cancelled while queued never reached the model, and one
    cancelled before its first reply left nothing the model said; their
    message would stand in the history as a question nobody answered (two
    user messages in a row). A turn cancelled after a reply stays, with its
    calls (their results, or "cancelled by operator: …"), so the model knows
    what its tools did.
    """
    return turn.state is TurnState.CANCELLED and not turn.steps


SUMMARY_NAME = "summary"


def summary_message(compaction: dict[str, Any]) -> Message:
    """The message that carries a context summary into a request."""
    turns = compaction["turns"]
    noun = "turn" if turns == 1 else "turns"
    return Message(
        "system",
        f"Summary of the conversation's first {turns} {noun}:\n{compaction['summary']}",
        name=SUMMARY_NAME,
    )


def message_chars(message: Message) -> int:
    """What a message adds to a request's size, in characters (content and tool calls)."""
    size = len(message.content)
    for call in message.tool_calls:
        size += len(call.get("name", "")) + len(_as_json(call.get("arguments")))
    return size


# Finished turns never change again (no event touches a completed, failed or
# abandoned turn or its calls), and session copies share their objects, so
# their messages are rendered once per turn object and remembered for as long
# as the object lives. Open turns are rendered every time.
_rendered: dict[int, tuple[weakref.ref[Turn], tuple[Message, ...]]] = {}


def turn_messages(session: Session, turn: Turn) -> tuple[Message, ...]:
    """The messages one turn of ``session`` contributes to a request."""
    return _turn_messages(session, turn)


def _turn_messages(session: Session, turn: Turn) -> tuple[Message, ...]:
    if turn.state.is_open:
        return _render(session, turn)
    key = id(turn)
    hit = _rendered.get(key)
    if hit is not None and hit[0]() is turn:
        return hit[1]
    messages = _render(session, turn)
    _rendered[key] = (weakref.ref(turn, _forget(key)), messages)
    return messages


def _forget(key: int) -> Callable[[weakref.ref[Turn]], None]:
    def forget(_: weakref.ref[Turn]) -> None:
        _rendered.pop(key, None)

    return forget


def _render(session: Session, turn: Turn) -> tuple[Message, ...]:
    messages = [Message("user", turn.message)]
    for step in turn.steps:
        calls = [session.calls[c] for c in step.call_ids]
        messages.append(
            Message(
                "assistant",
                step.text,
                tool_calls=tuple(
                    {"call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in calls
                ),
            )
        )
        for call in calls:
            messages.append(
                Message("tool", tool_result_text(call), tool_call_id=call.call_id, name=call.name)
            )
    if turn.state is TurnState.COMPLETED and not _reply_is_last_step(turn.reply, turn.steps):
        messages.append(Message("assistant", turn.reply))
    return tuple(messages)


def _reply_is_last_step(reply: str, steps: list[Any]) -> bool:
    """A completed turn's reply is normally its last step's text, already included."""
    return bool(steps) and not steps[-1].call_ids and steps[-1].text == reply


def _as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
