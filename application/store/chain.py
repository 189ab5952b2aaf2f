"""The hash chain: each stored event carries a hash chained to the previous event of its stream.

``hash(v) = sha256(hash(v - 1) ‖ topic ‖ 0x00 ‖ state)``, with ``hash(0)`` the
empty string, over the bytes exactly as stored (``topic`` in UTF-8; the NUL
byte separates it from the state, and a topic cannot contain one). The
recorder computes it inside its one insert statement
(``application.store.recorder``): the previous hash is read there from the
stream's row at ``version - 1``, and several events of one stream saved
together chain among themselves. That is safe without a lock because a
stream's versions are unique (the primary key): once an insert of version
*v* succeeds, the row at *v* - 1 it chained from is the only one there can
ever be, and it was committed before (a writer can only save *v* after
having read *v* - 1 committed).

Rows stored before the chain have no hash (NULL), and an event following an
unchained one gets none either: its stream stays unchained until
``turnlog audit --chain-existing`` hashes it, once, from its first event.
That command writes only the hash column; stored payloads are never
rewritten. It hashes only streams that were never chained (no hash at
all): a stream that has hashes and a broken or missing link is refused, by
name, so that an edited stream cannot be re-hashed into one that verifies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import sql

from turnlog.application.store.logorder import table

SEPARATOR = b"\x00"


def link(previous: bytes, topic: str, state: bytes) -> bytes:
    """The hash of an event whose stream's previous event has hash ``previous`` (b"" for none)."""
    return hashlib.sha256(previous + topic.encode("utf-8") + SEPARATOR + state).digest()


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def migration_statement(schema: str, events_table: str) -> sql.Composed:
    """Add the nullable ``hash`` column when it is missing (no rewrite of stored events)."""
    return sql.SQL(
        "DO $CHAIN$ BEGIN"
        " IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = {regclass}::regclass"
        "   AND attname = 'hash' AND NOT attisdropped) THEN"
        "   ALTER TABLE {table} ADD COLUMN hash bytea;"
        " END IF;"
        " END $CHAIN$"
    ).format(
        regclass=sql.Literal(f"{_quoted(schema)}.{_quoted(events_table)}"),
        table=table(schema, events_table),
    )


# Cross-joined into a statement, this makes its transaction's commit not wait for the
# disk (``synchronous_commit`` off for that transaction only, as ``SET LOCAL`` would).
# The next commit that waits for the disk makes it durable too (the WAL is one sequence).
RIDING = sql.SQL(" CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS rides")


# The most events of one stream a save inserts with ``stream_insert_statement``.
STREAM_INSERT_MAX = 4


def stream_insert_statement(
    schema: str, events_table: str, count: int, riding: bool = False
) -> sql.Composed:
    """``insert_statement`` for ``count`` events of one stream at consecutive versions.

    The same rows, hashes and refusals, from scalar parameters (``stream_params``)
    and without the recursion: the hash of the event ``n`` after the first is
    written out as ``n`` nested sha256 calls (``count`` is at most
    ``STREAM_INSERT_MAX``). About 60 % of the general statement's time, for the
    saves every turn makes.
    """
    if not 1 <= count <= STREAM_INSERT_MAX:
        raise ValueError(f"a stream insert takes 1 to {STREAM_INSERT_MAX} events, not {count}")

    def chained(n: int) -> str:
        previous = "p.h0" if n == 0 else chained(n - 1)
        return (
            f"sha256({previous} || convert_to(%(t{n})s::text, 'UTF8')"
            f" || decode('00', 'hex') || %(s{n})s::bytea)"
        )

    rows = ", ".join(f"({n}, %(t{n})s::text, %(s{n})s::bytea, {chained(n)})" for n in range(count))
    return sql.SQL(
        "WITH p AS (SELECT CASE WHEN %(v)s::bigint = 1 THEN ''::bytea ELSE e.hash END AS h0"
        " FROM (SELECT 1) AS one LEFT JOIN {t} e"
        "  ON e.originator_id = %(i)s::uuid AND e.originator_version = %(v)s::bigint - 1"
        " WHERE %(v)s::bigint = 1 OR e.originator_id IS NOT NULL)"
        " INSERT INTO {t} (originator_id, originator_version, topic, state, xact_id, hash)"
        " SELECT %(i)s::uuid, %(v)s::bigint + r.n, r.t, r.s, pg_current_xact_id(), r.h"
        " FROM p CROSS JOIN LATERAL (VALUES {rows}) AS r(n, t, s, h){riding}"
        " WHERE %(e)s::timestamptz IS NULL OR pg_postmaster_start_time() = %(e)s::timestamptz"
        " ORDER BY r.n"
        " RETURNING notification_id, pg_postmaster_start_time() AS epoch"
    ).format(
        t=table(schema, events_table),
        rows=sql.SQL(rows),  # built here from numbers only
        riding=RIDING if riding else sql.SQL(""),
    )


def stream_params(
    stream: Any, first: int, topics: Sequence[str], states: Sequence[bytes], epoch: Any
) -> dict[str, Any]:
    """``stream_insert_statement``'s parameters."""
    params: dict[str, Any] = {"i": stream, "v": first, "e": epoch}
    for n, (topic, state) in enumerate(zip(topics, states, strict=True)):
        params[f"t{n}"] = topic
        params[f"s{n}"] = state
    return params


def one_stream(ids: Sequence[Any], versions: Sequence[int]) -> bool:
    """Whether a save's events are of one stream, at consecutive versions, and few enough."""
    first = versions[0]
    return (
        len(ids) <= STREAM_INSERT_MAX
        and all(i == ids[0] for i in ids)
        and all(v == first + n for n, v in enumerate(versions))
    )


def insert_statement(schema: str, events_table: str, riding: bool = False) -> sql.Composed:
    """One statement: insert the events with their transaction id and their chained hash.

    ``c`` starts, for each stream of the save, at its first new event, from
    the stored previous row's hash (the empty string at version 1; NULL when
    that row is unchained), and recurses through the save's following
    versions of the same stream. A stream whose previous row is missing
    (a gap: a commit that rode was lost in a crash of the database, and this
    writer did not know) has no start in ``c``; then the statement inserts
    nothing at all, and returns no row (the recorder reports a conflict).
    So it does when the epoch given (twice; NULL: any) is not the server's:
    the writer's session object was read before the server restarted
    (``store.epoch``). ``riding``: the commit does not wait for the disk
    (``domain.durability``). Parameters: ids, versions, topics, states, epoch, epoch.
    """
    return sql.SQL(
        "WITH RECURSIVE u AS ("
        "  SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::bytea[])"
        "   WITH ORDINALITY AS u(i, v, t, s, n)),"
        " c(i, v, h) AS ("
        "  SELECT u.i, u.v, sha256("
        "    CASE WHEN u.v = 1 THEN ''::bytea ELSE p.hash END"
        "    || convert_to(u.t, 'UTF8') || decode('00', 'hex') || u.s)"
        "  FROM u LEFT JOIN {t} p ON p.originator_id = u.i AND p.originator_version = u.v - 1"
        "  WHERE NOT EXISTS (SELECT 1 FROM u w WHERE w.i = u.i AND w.v = u.v - 1)"
        "   AND (u.v = 1 OR p.originator_id IS NOT NULL)"
        "  UNION ALL"
        "  SELECT u.i, u.v, sha256(c.h || convert_to(u.t, 'UTF8') || decode('00', 'hex') || u.s)"
        "  FROM c JOIN u ON u.i = c.i AND u.v = c.v + 1)"
        " INSERT INTO {t} (originator_id, originator_version, topic, state, xact_id, hash)"
        " SELECT u.i, u.v, u.t, u.s, pg_current_xact_id(), c.h"
        " FROM u JOIN c ON c.i = u.i AND c.v = u.v{riding}"
        " WHERE (SELECT count(*) FROM c) = (SELECT count(*) FROM u)"
        "  AND (%s::timestamptz IS NULL OR pg_postmaster_start_time() = %s::timestamptz)"
        " ORDER BY u.n"
        " RETURNING notification_id, pg_postmaster_start_time() AS epoch"
    ).format(t=table(schema, events_table), riding=RIDING if riding else sql.SQL(""))


@dataclass(frozen=True)
class Link:
    """One stored event as the chain sees it."""

    position: int
    version: int
    topic: str
    state: bytes
    hash: bytes | None


@dataclass
class ChainCheck:
    """What recomputing a stream's chain found."""

    chained: int = 0  # events whose stored hash was recomputed and matched
    unchained: list[int] = field(default_factory=list)  # versions without a hash
    broken: list[str] = field(default_factory=list)  # the first broken link first
    head: bytes | None = None


def check(links: Sequence[Link]) -> ChainCheck:
    """Recompute each link from the previous stored hash; name every link that does not hold.

    Each event is checked against its predecessor's *stored* hash, so an event
    changed by hand breaks its own link (its stored hash no longer matches its
    bytes) and, had its hash been recomputed too, the next one's.
    """
    result = ChainCheck()
    previous: bytes | None = b""  # the hash before version 1
    for row in links:
        where = f"version {row.version} (position {row.position}, {row.topic})"
        if row.hash is None:
            result.unchained.append(row.version)
            if previous:
                result.broken.append(f"{where} has no hash though the event before it has one")
        elif previous is None:
            result.broken.append(f"{where} has a hash though the event before it has none")
        else:
            expected = link(previous, row.topic, row.state)
            if expected == row.hash:
                result.chained += 1
            else:
                result.broken.append(
                    f"chain broken at {where}: stored hash {row.hash.hex()}, recomputed"
                    f" {expected.hex()}: this event or its hash was changed after it was stored"
                )
        previous = row.hash
    result.head = links[-1].hash if links else None
    return result


_STREAM = sql.SQL(
    "SELECT notification_id, originator_version, topic, state, hash FROM {t}"
    " WHERE originator_id = %s ORDER BY originator_version"
)


def read_links(conn: Any, schema: str, events_table: str, session_id: UUID) -> list[Link]:
    rows = conn.execute(_STREAM.format(t=table(schema, events_table)), [session_id]).fetchall()
    return [
        Link(
            r["notification_id"],
            r["originator_version"],
            r["topic"],
            bytes(r["state"]),
            bytes(r["hash"]) if r["hash"] is not None else None,
        )
        for r in rows
    ]


def head(conn: Any, schema: str, events_table: str, session_id: UUID) -> tuple[int, bytes | None]:
    """The stream's last version and its hash (None: unchained); (0, None) for no stream."""
    row = conn.execute(
        sql.SQL(
            "SELECT originator_version, hash FROM {t} WHERE originator_id = %s"
            " ORDER BY originator_version DESC LIMIT 1"
        ).format(t=table(schema, events_table)),
        [session_id],
    ).fetchone()
    if row is None:
        return 0, None
    return int(row["originator_version"]), bytes(row["hash"]) if row["hash"] else None


@dataclass(frozen=True)
class Chained:
    session_id: UUID
    events: int  # hashes written
    refused: str = ""  # why the stream was not chained (empty: it was)


def chain_existing(
    datastore: Any,
    schema: str,
    events_table: str,
    progress: Callable[[Chained, int, int], None] = lambda c, i, n: None,
    max_passes: int = 10,
) -> list[Chained]:
    """Hash, from its first event, every stream that was never chained (only the hash column).

    A stream with any stored hash is not re-hashed: it was chained, so a
    missing or broken link in it is evidence (an edit, or a hash removed)
    and is refused with the first broken link named. Each stream in its own
    transaction. A writer that saves the stream's next event meanwhile may
    still chain from an unhashed row (its hash stays NULL); the stream is
    then looked at again, up to ``max_passes`` times, and only that tail,
    after the hashes this run wrote and checked, is hashed.
    """
    t = table(schema, events_table)
    with datastore.get_connection() as conn:
        streams = [
            r["originator_id"]
            for r in conn.execute(
                sql.SQL("SELECT DISTINCT originator_id FROM {} WHERE hash IS NULL").format(t)
            ).fetchall()
        ]
    done: list[Chained] = []
    for index, session_id in enumerate(streams, 1):
        written, refused = 0, ""
        for _ in range(max_passes):
            count, refused = _chain_stream(
                datastore, schema, events_table, session_id, extend=written > 0
            )
            if count == 0:
                break
            written += count
        chained = Chained(session_id, written, refused)
        done.append(chained)
        progress(chained, index, len(streams))
    return done


def _chain_stream(
    datastore: Any, schema: str, events_table: str, session_id: UUID, extend: bool
) -> tuple[int, str]:
    """Hash the stream's unhashed events: (hashes written, why refused).

    ``extend``: this run already chained the stream, so a hashed prefix
    that checks whole may be followed by an unhashed tail (a concurrent
    writer's); otherwise any stored hash refuses the stream.
    """
    t = table(schema, events_table)
    with datastore.transaction(commit=True) as curs:
        links = read_links(curs, schema, events_table, session_id)
        hashed = [row for row in links if row.hash is not None]
        if hashed:
            prefix = links[: len(hashed)]
            found = check(prefix)
            if not extend or prefix != hashed or found.broken:
                first = found.broken[0] if found.broken else check(links).broken[0]
                return 0, f"it has a chain and the chain is broken: {first}"
        previous = hashed[-1].hash if hashed else b""
        versions: list[int] = []
        hashes: list[bytes] = []
        for row in links[len(hashed) :]:
            assert previous is not None
            previous = link(previous, row.topic, row.state)
            versions.append(row.version)
            hashes.append(previous)
        if not versions:
            return 0, ""
        curs.execute(
            sql.SQL(
                "UPDATE {t} e SET hash = x.h"
                " FROM unnest(%s::bigint[], %s::bytea[]) AS x(v, h)"
                " WHERE e.originator_id = %s AND e.originator_version = x.v AND e.hash IS NULL"
            ).format(t=t),
            [versions, hashes, session_id],
        )
        return len(versions), ""
