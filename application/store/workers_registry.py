"""The workers registry: a small operational table (not event-sourced) of the workers.

A worker registers when it starts, beats every few seconds with the number
of turns it holds, and marks itself stopped when it drains; ``turnlog
workers``, ``GET /v1/workers`` and the console list the rows.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import psycopg
from psycopg import sql

from turnlog.application.settings import schema_name
from turnlog.application.store.database import Database, bootstrap_lock, connect


def workers_table(namespace: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(
        sql.Identifier(schema_name(namespace)), sql.Identifier("workers")
    )


def create_workers_table(db: Database, namespace: str) -> None:
    """Create the table if it is missing (under the bootstrap lock)."""
    with bootstrap_lock(db) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (worker_id text PRIMARY KEY, pid integer NOT NULL,"
                " host text NOT NULL, started_at timestamptz NOT NULL DEFAULT now(),"
                " heartbeat_at timestamptz NOT NULL DEFAULT now(), turns_held integer NOT NULL"
                " DEFAULT 0, concurrency integer NOT NULL DEFAULT 1, stopped_at timestamptz)"
            ).format(workers_table(namespace))
        )


def register_worker(db: Database, namespace: str, worker_id: str, concurrency: int) -> None:
    """Add this process's worker (its pid and host) to the registry."""
    create_workers_table(db, namespace)
    with connect(db) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (worker_id, pid, host, concurrency) VALUES (%s, %s, %s, %s)"
            ).format(workers_table(namespace)),
            (worker_id, os.getpid(), socket.gethostname(), concurrency),
        )


def heartbeat(
    conn: psycopg.Connection[Any], namespace: str, worker_id: str, turns_held: int
) -> None:
    """The worker is alive now, holding ``turns_held`` turns."""
    conn.execute(
        sql.SQL("UPDATE {} SET heartbeat_at = now(), turns_held = %s WHERE worker_id = %s").format(
            workers_table(namespace)
        ),
        (turns_held, worker_id),
    )


def mark_stopped(db: Database, namespace: str, worker_id: str) -> None:
    """The worker has drained: it holds no turn and takes no more."""
    with connect(db) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET stopped_at = now(), turns_held = 0 WHERE worker_id = %s").format(
                workers_table(namespace)
            ),
            (worker_id,),
        )


def list_workers(db: Database, namespace: str) -> list[dict[str, Any]]:
    """Registered workers, newest first, with heartbeat age in seconds."""
    query = sql.SQL(
        "SELECT worker_id, pid, host, started_at, heartbeat_at, turns_held, concurrency,"
        " stopped_at, extract(epoch FROM now() - heartbeat_at) FROM {} ORDER BY started_at DESC"
    ).format(workers_table(namespace))
    with connect(db) as conn:
        try:
            rows = conn.execute(query).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
    keys = (
        "worker_id",
        "pid",
        "host",
        "started_at",
        "heartbeat_at",
        "turns_held",
        "concurrency",
        "stopped_at",
        "heartbeat_age_seconds",
    )
    out = []
    for row in rows:
        item = dict(zip(keys, row, strict=True))
        for k in ("started_at", "heartbeat_at", "stopped_at"):
            item[k] = item[k].isoformat() if item[k] else None
        item["heartbeat_age_seconds"] = round(float(item["heartbeat_age_seconds"]), 3)
        out.append(item)
    return out
