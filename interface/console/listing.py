"""The sessions list of the console: the read model's pages, and "needs attention".

"Needs attention" lists every blocked session first (an interrupted turn
waits for an operator), then every one awaiting approval (a proposed tool
call waits for an operator; its rows carry the calls, ``proposed_calls``),
then every busy one (a turn in flight, which may be stuck), then every idle
one whose last turn failed, each newest activity first; each row says which
group it is in (``attention``). Its cursor says which of the lists it is in:
``blocked~<cursor>``, ``approval~<cursor>``, ``busy~<cursor>`` or
``failed~<cursor>``, the inner cursor being the read model's own.
"""

from __future__ import annotations

from typing import Any

from turnlog.interface.problems import InvalidRequest
from turnlog.projections import ReadModels

# (group, session status, last turn's state): the lists of "needs attention", in order.
GROUPS = (
    ("blocked", "blocked", None),
    ("approval", "awaiting_approval", None),
    ("busy", "busy", None),
    ("failed", "idle", "failed"),
)
ATTENTION = tuple(name for name, _, _ in GROUPS)
FILTERS = ("idle", "busy", "blocked", "awaiting_approval", "closed", "attention")
# Proposed calls shown per session awaiting approval (calls are proposed one at a time).
MAX_PROPOSED_SHOWN = 20

Page = tuple[list[dict[str, Any]], str | None]


def sessions_page(
    read_models: ReadModels, show: str, limit: int, cursor: str | None, search: str = ""
) -> Page:
    """One page of sessions; ``show`` is a status, ``attention`` or '' for all.

    ``search`` (an id prefix, or words of a title) lists the matching sessions
    instead, newest activity first, on one page.
    """
    if search.strip():
        return read_models.search_sessions(search, limit), None
    if show == "attention":
        rows, following = attention_page(read_models, limit, cursor)
    else:
        rows, following = read_models.list_sessions(show or None, limit, cursor)
    return with_proposed_calls(read_models, rows), following


def with_proposed_calls(
    read_models: ReadModels, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each session awaiting approval with the calls that wait (``proposed_calls``)."""
    for row in rows:
        if row["status"] == "awaiting_approval":
            calls, _ = read_models.list_tool_calls(
                "proposed", row["session_id"], None, MAX_PROPOSED_SHOWN
            )
            row["proposed_calls"] = calls
    return rows


def attention_page(read_models: ReadModels, limit: int, cursor: str | None) -> Page:
    """Blocked sessions, then those awaiting approval, busy and failed ones, ``limit`` at a time."""
    phase, inner = _decode(cursor)
    rows: list[dict[str, Any]] = []
    while phase < len(ATTENTION):
        name, status, last_turn = GROUPS[phase]
        got, following = read_models.list_sessions(status, limit - len(rows), inner, last_turn)
        rows += [{**row, "attention": name} for row in got]
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
    return any(
        read_models.list_sessions(status, 1, None, last_turn)[0]
        for _, status, last_turn in GROUPS[phase:]
    )


def _decode(cursor: str | None) -> tuple[int, str | None]:
    if not cursor:
        return 0, None
    status, sep, inner = cursor.partition("~")
    if not sep or status not in ATTENTION:
        raise InvalidRequest(f"cursor {cursor[:40]!r} is not a cursor of this list")
    return ATTENTION.index(status), inner or None
