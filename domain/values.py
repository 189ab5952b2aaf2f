"""What the record can hold: text that encodes as UTF-8, finite numbers, JSON not nested too deep.

A value that passes JSON parsing can still break the record for good: a
lone surrogate (``"\\ud800"`` is valid JSON) cannot be encoded as UTF-8, so
the save fails; a value nested hundreds deep saves, then makes every later
load of the session overflow Python's recursion (copying, replaying). Either
one, arriving from a model's reply, crashed the worker on every attempt. A
NaN or an infinity (Python's JSON parser accepts ``NaN``, ``Infinity`` and
``1e400``) is stored as a bare ``NaN`` token that is not JSON — other
languages, ``jq`` and ``::jsonb`` fail on the log — and reads back as null.
So values are checked where they enter the aggregate, without recursion.
"""

from __future__ import annotations

import math
from typing import Any

from turnlog.domain import errors

MAX_DEPTH = 64  # nesting of JSON objects and arrays in one value


def check_storable(value: Any, what: str) -> None:
    """Raise InvalidInput when ``value`` could not be stored and loaded again.

    The message names ``what`` and the problem, never the value itself.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, what)
        elif isinstance(item, float) and not math.isfinite(item):
            raise errors.InvalidInput(
                f"{what} contains a number JSON cannot represent (NaN or an infinity)"
            )
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                raise errors.InvalidInput(f"{what} is nested more than {MAX_DEPTH} levels deep")
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str):
                        _check_text(key, what)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidInput(
            f"{what} contains text that is not valid Unicode (a lone surrogate)"
        ) from None


def storable_text(text: str) -> str:
    """``text`` with anything UTF-8 cannot encode replaced by U+FFFD (for error texts)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text
