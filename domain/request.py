"""The pure function from a session to the next model request.

Every tool call the model ever made is answered in the request, so a
provider's rule that each call has a result always holds: calls whose
outcome is unknown or was given up get an explicit placeholder.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from typing import Any, NamedTuple

from turnlog.domain.session import Session
from turnlog.domain.turns import RUNTIME_ACTOR, CallState, ToolCall, Turn, TurnState

PLACEHOLDER_UNKNOWN = "outcome unknown: the worker running this call stopped before it reported"
PLACEHOLDER_ABANDONED = "outcome unknown: abandoned by operator"
PLACEHOLDER_PROPOSED = "not run yet: waiting for an operator's approval"


class Message(NamedTuple):
    """One message of a model request (system, user, assistant or tool).

    A named tuple: a long request holds tens of thousands, and a resumed
    process builds them all from stored JSON (twice as fast as a dataclass).
    """

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


def next_request(
    session: Session, earlier: Session | None = None, said: Sequence[Message] | None = None
) -> ModelRequest:
    """Build the provider request from the session's state and its earlier turns.

    A session as the application loads it holds only its open turn; the
    finished turns the request carries come in ``earlier``: a retaining
    session rebuilt from those turns' own events (``Sessions.request_at``
    reads them from the stream by version range), or in ``said``: the
    messages those turns contribute, already rendered (``said_messages`` of
    each, in order; what ``Sessions.request_for`` keeps of finished turns).
    A retaining session holds every turn itself and needs neither.
    """
    messages: list[Message] = []
    if session.system_prompt:
        messages.append(Message("system", session.system_prompt))
    if session.compaction:
        # The latest context summary stands for every turn it covers; the
        # turns after it follow in full (``earlier`` holds only those).
        messages.append(summary_message(session.compaction))
    if said is not None:
        messages.extend(said)
    elif earlier is not None:
        for turn in earlier.turns:
            messages.extend(said_messages(earlier, turn))
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


def said_messages(earlier: Session, turn: Turn) -> tuple[Message, ...]:
    """What one turn of ``earlier`` adds to a request as an earlier turn (none: open or unsaid)."""
    if turn.state.is_open or _unsaid(turn):
        return ()
    return _turn_messages(earlier, turn)


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


def messages_to_json(messages: Sequence[Message]) -> str | None:
    """The messages as compact JSON that ``messages_from_json`` turns back into equal ones.

    Each is [role, content, tool calls, call id, name], trailing defaults left out.
    None when they would not come back equal (a value JSON does not carry).
    """
    rows = []
    for m in messages:
        row: list[Any] = [m.role, m.content, list(m.tool_calls), m.tool_call_id, m.name]
        while len(row) > 2 and not row[-1]:
            row.pop()
        rows.append(row)
    try:
        text = json.dumps(rows, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        text.encode()  # a lone surrogate has no UTF-8 form
    except (TypeError, ValueError):
        return None
    return text if messages_from_json(json.loads(text)) == tuple(messages) else None


def messages_from_json(rows: list[list[Any]]) -> tuple[Message, ...]:
    """Messages back from the decoded JSON of ``messages_to_json`` (whose rows it reuses)."""
    return tuple(map(_message, _completed(rows)))


def turns_from_json(turns: Sequence[list[list[Any]]]) -> list[tuple[Message, ...]]:
    """``messages_from_json`` of each turn's rows, all built in one pass."""
    built = messages_from_json(list(chain.from_iterable(turns)))
    out: list[tuple[Message, ...]] = []
    start = 0
    for count in map(len, turns):
        out.append(built[start : start + count])
        start += count
    return out


# Built from a whole row of fields, as ``Message._make`` does, without a call per message.
_message = partial(tuple.__new__, Message)
# What a stored row of n fields lacks (its trailing defaults are left out): none has fewer than 2.
_MISSING: tuple[Any, ...] = (None, None, ((), "", ""), ("", ""), ("",), ())


def _completed(rows: list[list[Any]]) -> list[list[Any]]:
    """The rows with their tool calls as tuples and all five fields (rows reused)."""
    for row in rows:
        count = len(row)
        if count > 2:
            row[2] = tuple(row[2])
        row += _MISSING[count]  # a row of 0, 1 or more than 5 fields is refused here
    return rows


def _as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
