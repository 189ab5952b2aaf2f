"""The sessions list of the console: the read model's pages, and "needs attention".

"Needs attention" lists every blocked session first (an interrupted turn
waits for an operator), then every busy one (a turn in flight, which may be
stuck), each newest activity first. Its cursor says which of the two lists
it is in: ``blocked~<cursor>`` or ``busy~<cursor>``, the inner cursor being
the read model's own.
"""

from __future__ import annotations

from typing import Any

from turnlog.interface.problems import InvalidRequest
from turnlog.projections import ReadModels

ATTENTION = ("blocked", "busy")
FILTERS = ("idle", "busy", "blocked", "closed", "attention")

Page = tuple[list[dict[str, Any]], str | None]


def sessions_page(read_models: ReadModels, show: str, limit: int, cursor: str | None) -> Page:
    """One page of sessions; ``show`` is a status, ``attention`` or '' for all."""
    if show == "attention":
        return attention_page(read_models, limit, cursor)
    return read_models.list_sessions(show or None, limit, cursor)


def attention_page(read_models: ReadModels, limit: int, cursor: str | None) -> Page:
    """Blocked sessions, then busy ones, ``limit`` at a time."""
    phase, inner = _decode(cursor)
    rows: list[dict[str, Any]] = []
    while phase < len(ATTENTION):
        got, following = read_models.list_sessions(ATTENTION[phase], limit - len(rows), inner)
        rows += got
        if following:
            return rows, f"{ATTENTION[phase]}~{following}"
        phase, inner = phase + 1, None
        if len(rows) == limit:
            break
    if phase < len(ATTENTION) and _any_from(read_models, phase):
        return rows, f"{ATTENTION[phase]}~"
    return rows, None


def _any_from(read_models: ReadModels, phase: int) -> bool:
    """Whether a later list has any row: a "next page" must never be empty."""
    return any(read_models.list_sessions(status, 1)[0] for status in ATTENTION[phase:])


def _decode(cursor: str | None) -> tuple[int, str | None]:
    if not cursor:
        return 0, None
    status, sep, inner = cursor.partition("~")
    if not sep or status not in ATTENTION:
        raise InvalidRequest(f"cursor {cursor[:40]!r} is not a cursor of this list")
    return ATTENTION.index(status), inner or None
