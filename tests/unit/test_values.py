"""Values the record can hold, and rows the read models can store."""

from __future__ import annotations

import pytest

from turnlog.domain import errors
from turnlog.domain.values import MAX_DEPTH, check_storable, storable_text
from turnlog.projections.rows import Rows, Table, storable

TABLE = Table(
    columns=(("session_id", "text"), ("call_id", "text"), ("tool", "text"), ("ids", "text[]")),
    key=("session_id", "call_id"),
    scope=("session_id",),
    scope_of=lambda event: None,
)


def nested(depth: int) -> object:
    """``depth`` levels of objects and arrays, alternating."""
    value: object = "leaf"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


def test_plain_json_of_any_text_is_storable() -> None:
    check_storable(
        {"title": "'; DROP TABLE x; --", "nul": "a\x00b", "emoji": "😀", "n": [1, None]}, "x"
    )
    check_storable(nested(MAX_DEPTH - 1), "x")


@pytest.mark.parametrize(
    "value",
    [
        "\ud800",
        {"k\udfff": 1},
        ["ok", {"deep": "\udc80"}],
        nested(MAX_DEPTH + 1),
        nested(10_000),
        float("nan"),
        {"n": [1, float("inf")]},
        -float("inf"),
    ],
    ids=[
        "lone surrogate",
        "in a key",
        "deep inside",
        "one level too deep",
        "far too deep",
        "NaN",
        "infinity inside",
        "-infinity",
    ],
)
def test_values_the_record_cannot_hold_are_refused_without_quoting_them(value: object) -> None:
    with pytest.raises(errors.InvalidInput) as refused:
        check_storable(value, "the model's reply")
    assert refused.value.detail.startswith("the model's reply")
    assert "\ud800" not in refused.value.detail and "\udfff" not in refused.value.detail


def test_an_error_text_is_made_storable_rather_than_refused() -> None:
    assert storable_text("bad \ud800 byte?") == "bad \ufffd byte?"
    assert storable_text("fine") == "fine"


def test_rows_hold_texts_with_nul_replaced_and_find_them_by_the_original_key() -> None:
    rows = Rows(TABLE)
    rows.put({"session_id": "s", "call_id": "c\x00", "tool": "ec\x00ho", "ids": ["a\x00"]})
    row = rows.get(("s", "c\x00"))
    assert row == {
        "session_id": "s",
        "call_id": "c\ufffd",
        "tool": "ec\ufffdho",
        "ids": ["a\ufffd"],
    }
    assert rows.update(("s", "c\x00"), tool="t") is not None
    rows.delete(("s", "c\x00"))
    assert rows.all() == [] and storable(5) == 5


def test_a_dict_in_a_row_has_nul_replaced_in_its_keys_and_values_all_the_way_down() -> None:
    """jsonb refuses NUL anywhere: a session's metadata with one once stopped its read model."""
    meta = {"k\x00": ["a\x00", {"b": "c\x00"}], "n": 5, "fine": "x"}
    assert storable(meta) == {"k\ufffd": ["a\ufffd", {"b": "c\ufffd"}], "n": 5, "fine": "x"}
    assert meta["k\x00"] == ["a\x00", {"b": "c\x00"}]  # the event's own value is not changed
