"""A snapshot's finished-turn entries, stored once, in chunks beside the snapshots.

A session's state holds an entry per finished turn (``Session.finished``), so
a snapshot that held them all would grow with the session and rewrite them
all every ``snapshot_interval`` events. Instead, when a snapshot is stored
(``seal.SnapshotRecorder``), the entries no chunk holds yet move to a new
chunk row once there are ``CHUNK`` of them, in the same transaction; the
snapshot keeps only the entries after its chunks, and names how many entries
its chunks hold and a digest of them (``MARK``). What each snapshot writes is
then bounded, whatever the session's length.

A load reads the chunks a snapshot names and gives the library the snapshot
whole again, as it was taken. A snapshot whose chunks are missing, not
contiguous or not what its digest says is ignored, as one whose seal fails:
the session is replayed from its events. Chunks are never rewritten (an entry
never changes once appended); a purge deletes them with the session's other
rows (their ``session_id`` column). Snapshots stored before chunks carry every
entry and no mark: they load unchanged.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from psycopg.sql import SQL, Composed

from turnlog.application.store.logorder import table

CHUNK = 64  # entries a snapshot keeps inline before they move to a chunk
MARK = "finished_chunked"  # in a snapshot's state: {"count": entries chunked, "digest": hex}
_MARK_BYTES = b'"finished_chunked"'


def chunks_table_of(snapshots_table: str) -> str:
    """``x_snapshots`` keeps its chunks in ``x_finished_chunks``."""
    return snapshots_table.removesuffix("_snapshots") + "_finished_chunks"


def create_statement(schema: str, snapshots_table: str) -> Composed:
    return SQL(
        "CREATE TABLE IF NOT EXISTS {t} (session_id uuid NOT NULL, first_n integer NOT NULL,"
        " last_n integer NOT NULL, entries bytea NOT NULL, PRIMARY KEY (session_id, first_n))"
    ).format(t=table(schema, chunks_table_of(snapshots_table)))


def digest(entries: list[Any]) -> str:
    return hashlib.sha256(_encode(entries)).hexdigest()


def _encode(obj: Any) -> bytes:
    # As the library's JSONTranscoder writes it, so the mapper decodes it alike.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf8")


def _state_of(stored: StoredEvent) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the snapshot's decoded JSON, the aggregate state in it), or None if not a session's."""
    try:
        obj = json.loads(stored.state.decode("utf8"))
    except ValueError:
        return None
    state = obj.get("state") if isinstance(obj, dict) else None
    if not isinstance(state, dict) or not isinstance(state.get("finished"), list):
        return None
    return obj, state


def _chunked_through(rows: list[Any], limit: int) -> int:
    """How many leading entries the chunk rows hold contiguously, up to ``limit``."""
    through = 0
    for first_n, last_n in rows:
        if first_n != through or last_n > limit:
            break
        through = last_n
    return through


def may_chunk(stored: StoredEvent) -> bool:
    """Whether the snapshot holds enough entries for any of them to be in chunks."""
    decoded = _state_of(stored)
    return decoded is not None and len(decoded[1]["finished"]) >= CHUNK


def strip(curs: Any, schema: str, snapshots_table: str, stored: StoredEvent) -> StoredEvent:
    """The snapshot to store: its older entries in chunks (a new one written if due)."""
    decoded = _state_of(stored)
    if decoded is None:
        return stored
    obj, state = decoded
    entries: list[Any] = state["finished"]
    chunks = table(schema, chunks_table_of(snapshots_table))
    session_id = stored.originator_id
    curs.execute(
        SQL("SELECT first_n, last_n FROM {t} WHERE session_id = %s ORDER BY first_n").format(
            t=chunks
        ),
        (session_id,),
    )
    through = _chunked_through([(r["first_n"], r["last_n"]) for r in curs.fetchall()], len(entries))
    tail = entries[through:]
    # Entries upcast from a version-1 snapshot have no version range (0) until
    # the application fills it: they stay inline until then.
    if len(tail) >= CHUNK and all(isinstance(e, list) and e[2] for e in tail):
        curs.execute(
            SQL(
                "INSERT INTO {t} (session_id, first_n, last_n, entries) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING RETURNING 1"
            ).format(t=chunks),
            (session_id, through, len(entries), _encode(tail)),
        )
        if curs.fetchone() is not None:
            through = len(entries)
        # else another writer chunked from here at the same time: keep these inline.
    if through == 0:
        return stored
    state["finished"] = entries[through:]
    state[MARK] = {"count": through, "digest": digest(entries[:through])}
    return replace(stored, state=_encode(obj))


def splice(
    curs: Any, schema: str, snapshots_table: str, session_id: UUID, stored: list[StoredEvent]
) -> list[StoredEvent | None]:
    """Each snapshot whole again (None: its chunks do not prove out; do not use it)."""
    if not any(_MARK_BYTES in s.state for s in stored):
        return list(stored)
    curs.execute(
        SQL(
            "SELECT first_n, last_n, entries FROM {t} WHERE session_id = %s ORDER BY first_n"
        ).format(t=table(schema, chunks_table_of(snapshots_table))),
        (session_id,),
    )
    rows = curs.fetchall()
    out: list[StoredEvent | None] = []
    for snapshot in stored:
        decoded = _state_of(snapshot) if _MARK_BYTES in snapshot.state else None
        if decoded is None or not isinstance(decoded[1].get(MARK), dict):
            out.append(snapshot)
            continue
        obj, state = decoded
        mark = state.pop(MARK)
        whole = _joined(obj, state, mark, rows)
        if whole is None:
            whole = _decoded_and_joined(obj, state, mark, rows)
        out.append(None if whole is None else replace(snapshot, state=whole))
    return out


def _joined(
    obj: dict[str, Any], state: dict[str, Any], mark: dict[str, Any], rows: list[Any]
) -> bytes | None:
    """The snapshot whole again, its chunks' bytes joined as they are stored (None: unsure).

    A chunk holds ``_encode`` of its entries, so the array of all chunked
    entries is their texts joined by commas, which the digest was taken of.
    The snapshot's other fields are encoded again, with ``finished`` (and
    ``state``) last: the decoder reads keys in any order. None, and the
    entries are decoded and encoded again, when the bytes do not prove out.
    """
    parts: list[bytes] = []
    for row in _leading(rows, mark["count"]):
        text = bytes(row["entries"])
        if text[:1] != b"[" or text[-1:] != b"]" or len(text) < 3:
            return None
        parts.append(text[1:-1])
    chunked = b"[" + b",".join(parts) + b"]"
    if hashlib.sha256(chunked).hexdigest() != mark["digest"]:
        return None
    tail = _encode(state["finished"])
    if not parts or tail == b"[]":
        finished = tail if not parts else chunked
    else:
        finished = chunked[:-1] + b"," + tail[1:]
    head = _encode({k: v for k, v in obj.items() if k != "state"})[:-1]
    body = _encode({k: v for k, v in state.items() if k != "finished"})[:-1]
    return (
        head
        + (b"," if len(head) > 1 else b"")
        + b'"state":'
        + body
        + (b"," if len(body) > 1 else b"")
        + b'"finished":'
        + finished
        + b"}}"
    )


def _decoded_and_joined(
    obj: dict[str, Any], state: dict[str, Any], mark: dict[str, Any], rows: list[Any]
) -> bytes | None:
    """The snapshot whole again, every chunk decoded (None: its chunks do not prove out)."""
    entries: list[Any] = []
    for row in _leading(rows, mark["count"]):
        entries.extend(json.loads(bytes(row["entries"]).decode("utf8")))
    if len(entries) != mark["count"] or digest(entries) != mark["digest"]:
        return None
    state["finished"] = entries + state["finished"]
    return _encode(obj)


def _leading(rows: list[Any], count: int) -> list[Any]:
    """The chunk rows holding entries 0..count contiguously (empty: they do not)."""
    taken: list[Any] = []
    through = 0
    for row in rows:
        if row["last_n"] > count or row["first_n"] != through:
            break
        taken.append(row)
        through = row["last_n"]
    return taken if through == count else []
