"""The earlier turns of a request, from what they said rather than from their events.

``Sessions.request_for`` needs the messages of every finished turn after the
latest context summary. Each finished turn's messages are rendered once,
from its own events, and then kept: in this process's cache (by turn id) and
in the namespace's ``said_turns`` table (``application.store.said_turns``), so
that a process that has never seen the session reads them in one statement
instead of replaying the turns. The request is the one ``Sessions.request_at``
builds from the events (tests compare both builds).

The table is read by a process that knows nothing of the session yet (or
lacks more than a batch of its turns); otherwise only the turns it lacks are
replayed: in a process that runs the session's turns, the one that just
finished, from the events it saved. Rendered turns are written to the table
in batches (``WRITE_EVERY``) and at once after a read of the table that found
some missing, so a process that stops leaves at most a batch unwritten, which
the next one replays and writes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, repeat
from operator import lt
from typing import Any, NamedTuple, Protocol

from turnlog.application.collector import collector_paused
from turnlog.application.store import said_turns, session_log
from turnlog.domain.request import Message, messages_to_json, said_messages, turns_from_json
from turnlog.domain.session import Session
from turnlog.domain.turns import FinishedEntry

log = logging.getLogger("turnlog.sessions")

WRITE_EVERY = 16  # rendered turns a process keeps unwritten at most (while it reads nothing)


class Said(NamedTuple):
    """What one finished turn said, and where it sits in the request."""

    first_version: int
    ordinal: int  # among the turns that share its first version (a fork's inherited turns)
    last_version: int
    messages: tuple[Message, ...]
    stored: bool  # in the table (or not storable there): nothing to write


class Application(Protocol):
    """What this module uses of ``Sessions``."""

    recorder: Any
    cache: Any

    def replay_range(self, session_id: Any, first: int, last: int) -> Session: ...


@dataclass
class Kept:
    """What a process keeps of a session's finished turns between two of its requests."""

    said: dict[str, Said] = field(default_factory=dict)  # by turn id
    # The last request's earlier messages: ``count`` turns of the window after
    # ``compacted`` summarised ones. The next request of a session whose window
    # only grew starts from them and adds what the new turns said.
    compacted: int = -1
    count: int = 0
    messages: tuple[Message, ...] = ()
    unwritten: list[str] = field(default_factory=list)  # said, not in the table yet


def said_before(app: Application, session: Session) -> tuple[Message, ...]:
    """The messages of the finished turns the session's next request carries, in order."""
    window = session.finished[session.compacted_turns :]
    if not window:
        return ()
    kept: Kept = app.cache.take_said(session.id) or Kept()
    messages = _extended(app, session, window, kept)
    if messages is None:
        with collector_paused():  # every turn's messages: many objects that live on
            messages = _assembled(app, session, window, kept)
    kept.compacted, kept.count, kept.messages = session.compacted_turns, len(window), messages
    app.cache.put_said(session.id, kept)
    return messages


def _extended(
    app: Application, session: Session, window: Sequence[FinishedEntry], kept: Kept
) -> tuple[Message, ...] | None:
    """The last request's earlier messages and what the turns finished since said.

    None when the last request's window is not the start of this one (a new
    summary, another session's state), or the new turns are many or out of
    order: ``_assembled`` builds the whole request then.
    """
    count = kept.count
    if kept.compacted != session.compacted_turns or not 0 < count <= len(window):
        return None
    if not _fits(kept.said.get(window[count - 1].turn_id), window[count - 1]):
        return None
    new = window[count:]
    if len(new) > WRITE_EVERY or not _in_order(window[count - 1 :]):
        return None
    need = _unfit(kept.said, new)
    if need:
        rendered = _rendered(app, session, need)
        if len(rendered) < len(need):
            return None  # a turn that says nothing: as the whole build has it
        kept.said.update(rendered)
        kept.unwritten += list(rendered)
        if len(kept.unwritten) >= WRITE_EVERY:
            _write(app, session, kept.said, kept.unwritten)
            kept.unwritten = []
    return kept.messages + tuple(m for e in new for m in kept.said[e.turn_id].messages)


def _assembled(
    app: Application, session: Session, window: Sequence[FinishedEntry], kept: Kept
) -> tuple[Message, ...]:
    """The earlier messages of the request, every turn of the window looked at."""
    known = kept.said
    need = _unfit(known, window)
    # The table is read by a process that knows nothing of the session yet, or
    # is missing more than a batch; else the few turns it lacks are replayed.
    cold = not known or len(need) > WRITE_EVERY
    read = bool(need) and cold and session_log.on_postgres(app.recorder)
    if read:
        known.update(_read(app, session, need))
        need = _unfit(known, need)
    if need:
        known.update(_rendered(app, session, need))
    ids = {e.turn_id for e in window}
    if known.keys() != ids:
        known = {k: v for k, v in known.items() if k in ids}  # summarised turns drop out
    unwritten = [k for k, v in known.items() if not v.stored]
    if unwritten and (read or len(unwritten) >= WRITE_EVERY):
        _write(app, session, known, unwritten)
        unwritten = []
    kept.said, kept.unwritten = known, unwritten
    order = [e for e in window if e.turn_id in known] if len(known) < len(window) else window
    if not _in_order(order):
        order = sorted(order, key=lambda e: (e.first_version, known[e.turn_id].ordinal))
    return tuple(chain.from_iterable([known[e.turn_id].messages for e in order]))


def _read(app: Application, session: Session, need: Sequence[FinishedEntry]) -> dict[str, Said]:
    """The turns of ``need`` the table holds; none when its rows do not decode.

    The rows are derived: one of the wrong shape (written by hand, say) must
    not stop a turn. The turns are rendered from their events instead, and
    their rows written again.
    """
    try:
        return _stored(said_turns.read(app.recorder, session.id, *_span(need)))
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        log.warning(
            "the said rows of session %s do not decode (%s); its turns are rendered from"
            " their events and written again",
            session.id,
            type(exc).__name__,
        )
        return {}


def _stored(rows: list[said_turns.SaidRow]) -> dict[str, Said]:
    """The turns read from the table, by turn id."""
    if not rows:
        return {}
    ids, firsts, ordinals, lasts, messages = zip(*rows, strict=True)
    said = zip(firsts, ordinals, lasts, turns_from_json(messages), repeat(True))
    return dict(zip(ids, map(_said, said), strict=True))


_said = partial(tuple.__new__, Said)  # from all its fields, as Said._make


def _rendered(
    app: Application, session: Session, entries: Sequence[FinishedEntry]
) -> dict[str, Said]:
    """The turns of ``entries`` rebuilt from their own events and rendered."""
    earlier = app.replay_range(session.id, *_span(entries))
    places: dict[int, int] = {}
    ordinals: dict[str, int] = {}
    for t in earlier.turns:
        ordinals[t.turn_id] = places.get(t.first_version, 0)
        places[t.first_version] = ordinals[t.turn_id] + 1
    by_id = {t.turn_id: t for t in earlier.turns}
    out: dict[str, Said] = {}
    for e in entries:
        turn = by_id.get(e.turn_id)
        if turn is not None:  # else not in its own range: it says nothing (as a replay)
            said = said_messages(earlier, turn)
            out[e.turn_id] = Said(e.first_version, ordinals[e.turn_id], e.last_version, said, False)
    return out


def _write(app: Application, session: Session, known: dict[str, Said], ids: list[str]) -> None:
    rows = []
    for turn_id in ids:
        said = known[turn_id]
        known[turn_id] = said._replace(stored=True)
        text = messages_to_json(said.messages)
        if text is not None:  # else replayed whenever a process first needs it
            rows.append((turn_id, said.first_version, said.ordinal, said.last_version, text))
    if not session_log.on_postgres(app.recorder):
        return
    try:
        said_turns.write(app.recorder, session.id, session.version, rows)
    except Exception:  # derived rows: the request stands without them
        log.warning("could not store the said turns of session %s", session.id, exc_info=True)


def _fits(said: Said | None, entry: FinishedEntry) -> bool:
    return (
        said is not None
        and said.last_version == entry.last_version
        and said.first_version == entry.first_version
    )


def _unfit(known: dict[str, Said], entries: Sequence[FinishedEntry]) -> list[FinishedEntry]:
    """The entries whose turns ``known`` holds no fitting messages of."""
    if not known:
        return list(entries)
    return [e for e in entries if not _fits(known.get(e.turn_id), e)]


def _in_order(entries: Sequence[FinishedEntry]) -> bool:
    """Whether the entries' first versions strictly increase (each turn its own range)."""
    firsts = [e.first_version for e in entries]
    return all(map(lt, firsts, firsts[1:]))


def _span(entries: Sequence[FinishedEntry]) -> tuple[int, int]:
    return min(e.first_version for e in entries), max(e.last_version for e in entries)
