"""The insert's array parameters, written as PostgreSQL array literals in one step.

psycopg adapts a plain list by looking at its elements on every call (which
type, which dumper, how deep), and that lookup was about a tenth of a
turn's CPU: each save sends four arrays. The recorder knows their element
types, so it wraps them in these list types, whose dumpers write the text
of the array at once. The statement casts each parameter (``%s::uuid[]`` …),
so they are sent untyped (oid 0) and nothing else in the process changes:
only these classes are registered, and no dumper by oid.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
from psycopg.adapt import Dumper


class Uuids(list[UUID | str]):
    """Elements of a ``uuid[]`` parameter."""


class Integers(list[int]):
    """Elements of a ``bigint[]`` parameter."""


class Texts(list[str]):
    """Elements of a ``text[]`` parameter."""


class Blobs(list[bytes]):
    """Elements of a ``bytea[]`` parameter."""


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _ArrayDumper(Dumper):
    oid = 0  # unknown: the statement's cast names the type

    def dump(self, obj: Any) -> bytes:
        return ("{" + ",".join(self.element(e) for e in obj) + "}").encode()

    def element(self, value: Any) -> str:
        raise NotImplementedError


class _UuidsDumper(_ArrayDumper):
    def element(self, value: Any) -> str:
        return str(value)


class _IntegersDumper(_ArrayDumper):
    def element(self, value: Any) -> str:
        return str(int(value))


class _TextsDumper(_ArrayDumper):
    def element(self, value: Any) -> str:
        return _quoted(value)


class _BlobsDumper(_ArrayDumper):
    def element(self, value: Any) -> str:
        return '"\\\\x' + bytes(value).hex() + '"'


for _cls, _dumper in (
    (Uuids, _UuidsDumper),
    (Integers, _IntegersDumper),
    (Texts, _TextsDumper),
    (Blobs, _BlobsDumper),
):
    psycopg.adapters.register_dumper(_cls, _dumper)
