"""The insert's array parameters come back from PostgreSQL as they went in."""

from __future__ import annotations

from uuid import UUID, uuid4

import psycopg

from turnlog.application.store.arrays import Blobs, Integers, Texts, Uuids
from turnlog.application.store.database import Database

AWKWARD_TEXTS = ['a"b', "back\\slash", "x,y{z}", "", "NULL", " spaced ", "é ✓ 𝄞", "line\nbreak"]
AWKWARD_BLOBS = [b"", b"\x00", b'\\"{},', bytes(range(256)), b'{"json": "state"}']


def test_every_kind_of_element_comes_back_equal(database: Database) -> None:
    ids: list[UUID] = [uuid4(), UUID(int=0), UUID(int=2**128 - 1)]
    numbers = [1, 0, -5, 2**62]
    with psycopg.connect(database.conninfo) as conn:
        row = conn.execute(
            "SELECT %s::uuid[], %s::bigint[], %s::text[], %s::bytea[]",
            (Uuids(ids), Integers(numbers), Texts(AWKWARD_TEXTS), Blobs(AWKWARD_BLOBS)),
        ).fetchone()
    assert row == (ids, numbers, AWKWARD_TEXTS, AWKWARD_BLOBS)


def test_an_empty_array_is_an_empty_array(database: Database) -> None:
    with psycopg.connect(database.conninfo) as conn:
        row = conn.execute("SELECT cardinality(%s::text[])", (Texts([]),)).fetchone()
    assert row == (0,)
