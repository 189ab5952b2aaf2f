"""The context-window policy: when a request needs a summary, and what it summarises.

A session may limit its requests to ``max_turns`` turns after the latest
summary and/or ``max_chars`` characters. When the next request would exceed
the limit, the oldest finished turns after the summary are folded, with the
previous summary, into a new one (``Session.compact_context``), recorded
before the request. Everything here is pure: it reads the session and the
turns the request would carry (``earlier``, rebuilt from the stream) and
says how many turns to cover and what to ask the provider.

Only whole finished turns are ever covered: a finished turn's tool calls all
have their results, and the open turn, with any call still unanswered, is
always sent in full.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnlog.domain.request import (
    SUMMARY_NAME,
    Message,
    ModelRequest,
    message_chars,
    next_request,
    summary_message,
    turn_messages,
)
from turnlog.domain.session import Session
from turnlog.domain.turns import Turn

# The first message of a summarising request; a provider recognises the task by it.
SUMMARY_INSTRUCTION = (
    "You maintain the memory of a long conversation. Write a concise summary of the"
    " conversation below, including the summary of earlier turns if one is given, so that"
    " it can stand in for those turns from now on. Keep every fact, name, decision,"
    " commitment and open question a later turn may need, and every statement of the form"
    " 'The codeword is X'. Write plain text only."
)
SUMMARY_REQUEST = "Summarise the conversation above as instructed."


@dataclass(frozen=True)
class ContextPolicy:
    """A session's limits on its requests (None: that limit is not set)."""

    max_turns: int | None = None
    max_chars: int | None = None

    @classmethod
    def of(cls, session: Session) -> ContextPolicy | None:
        turns, chars = session.context_max_turns or None, session.context_max_chars or None
        return cls(turns, chars) if turns or chars else None

    def as_dict(self) -> dict[str, int | None]:
        return {"max_turns": self.max_turns, "max_chars": self.max_chars}


def window_turns(earlier: Session | None) -> list[Turn]:
    """The finished turns after the latest summary, oldest first, as rebuilt in ``earlier``."""
    return [t for t in earlier.turns if not t.state.is_open] if earlier is not None else []


def turns_to_cover(session: Session, earlier: Session | None) -> int:
    """How many of the oldest window turns the next request needs summarised (0: none).

    ``max_turns``: the request may carry at most that many turns after the
    summary, the open one included; once it would carry more, the oldest
    are covered so that about half remain, so compactions are rare.
    ``max_chars``: once the request would be longer, the oldest turns are
    covered until what remains is at most half the limit (or none is left).
    """
    policy = ContextPolicy.of(session)
    window = window_turns(earlier)
    if policy is None or not window or session.open_turn is None:
        return 0
    cover = 0
    if policy.max_turns is not None and len(window) + 1 > policy.max_turns:
        cover = len(window) - (policy.max_turns - 1) // 2
    if policy.max_chars is not None:
        request = next_request(session, earlier)
        total = sum(message_chars(m) for m in request.messages)
        if total > policy.max_chars:
            sizes = [turn_chars(earlier, t) for t in window]
            target, n = policy.max_chars // 2, 0
            while n < len(window) and total > target:
                total -= sizes[n]
                n += 1
            cover = max(cover, n)
    return cover


def turn_chars(earlier: Session | None, turn: Turn) -> int:
    """The characters one finished turn adds to a request."""
    if earlier is None:
        return 0
    return sum(message_chars(m) for m in turn_messages(earlier, turn))


def summarizing_request(session: Session, earlier: Session, cover: int) -> ModelRequest:
    """The request that asks the session's provider for the new summary.

    It carries the summarising instruction, the previous summary (if any),
    the ``cover`` oldest window turns in full, and a closing user message;
    no tools are offered.
    """
    window = window_turns(earlier)[:cover]
    messages: list[Message] = [Message("system", SUMMARY_INSTRUCTION)]
    if session.compaction:
        messages.append(summary_message(session.compaction))
    messages.extend(m for t in window for m in turn_messages(earlier, t))
    messages.append(Message("user", SUMMARY_REQUEST))
    return ModelRequest(
        provider=session.provider,
        model=session.model,
        messages=tuple(messages),
        tools=(),
        tools_chosen=True,
        turn=session.turn_count,
    )


def is_summarizing(request: ModelRequest) -> bool:
    """True for a request built by ``summarizing_request``."""
    first = request.messages[0] if request.messages else None
    return first is not None and first.role == "system" and first.content == SUMMARY_INSTRUCTION


__all__ = [
    "SUMMARY_INSTRUCTION",
    "SUMMARY_NAME",
    "ContextPolicy",
    "is_summarizing",
    "summarizing_request",
    "turn_chars",
    "turns_to_cover",
    "window_turns",
]
