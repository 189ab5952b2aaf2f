"""What a failing tool may leave behind: a bounded error text without host paths, a bounded log.

A tool's exception can be enormous (a chain of nearly a thousand exceptions
made one 3.3 MB log record) and can name this host's directories (an
``OSError`` quotes the absolute path of the file it failed on). Its text
leaves the process three ways — the stored ``ToolCallFailed`` error, the
API's ``tool_calls[].error`` and the model's next request — so it is made
short and its host paths are replaced by names before it is stored; what is
logged is bounded too.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable

MAX_ERROR_CHARS = 2000  # a stored error text
MAX_LOG_CHARS = 8192  # a logged exception, traceback included
MAX_CHAIN = 4  # exceptions of a chain (cause / context) shown in the log
MAX_FRAMES = 8  # frames shown per exception


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    note = f"… [{len(text) - limit} more characters]"
    return text[: max(0, limit - len(note))] + note


def without_paths(text: str, places: Iterable[tuple[str, str]]) -> str:
    """``text`` with each host path replaced by its name: ``(path, name)`` pairs, longest first."""
    for path, name in sorted(places, key=lambda p: -len(p[0])):
        if path:
            text = text.replace(path, name)
    return text


def error_text(exc: BaseException) -> str:
    """``Type: message`` of an exception, bounded (its message may itself be huge or fail)."""
    try:
        message = str(exc)
    except Exception:  # a tool's exception whose __str__ raises
        message = "(its message could not be rendered)"
    return shorten(f"{type(exc).__name__}: {message}", MAX_ERROR_CHARS)


def log_text(exc: BaseException) -> str:
    """A bounded traceback: the last frames of the first exceptions of the chain."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if len(seen) == MAX_CHAIN:
            parts.append("… (the rest of the exception chain is left out)\n")
            break
        seen.add(id(current))
        frames = traceback.extract_tb(current.__traceback__)[-MAX_FRAMES:]
        parts.append("".join(traceback.format_list(frames)) + error_text(current) + "\n")
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return shorten("".join(parts), MAX_LOG_CHARS)
