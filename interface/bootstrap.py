"""The composition root: the one place that knows every concrete class.

``build_runtime(settings)`` finds the database, prepares the namespace under
the bootstrap lock (schema, then the application's tables), and wires the
application with its providers and tools.
"""

from __future__ import annotations

import os
import socket
import uuid

from application import database
from application.execution import Executor
from application.providers import FixtureProvider, ProviderRegistry
from application.runtime import Runtime
from application.sessions import Sessions
from application.settings import Settings
from application.tools import ToolRegistry, builtin_tools


def worker_id() -> str:
    """host:pid:random — unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def open_sessions(settings: Settings, db: database.Database) -> Sessions:
    """Create the namespace (idempotently, under a lock) and its Sessions application."""
    with database.bootstrap_lock(db) as conn:
        database.create_schema(conn, settings.namespace)
        # Constructing with CREATE_TABLE=y creates the tables; doing it under
        # the lock keeps processes that start together from racing on CREATE.
        return Sessions(
            env=database.library_env(db, settings, create_table=True),
            snapshot_interval=settings.snapshot_interval,
        )


def build_runtime(settings: Settings) -> Runtime:
    """Everything a turnlog process needs, built once at start-up."""
    db = database.locate(settings)
    sessions = open_sessions(settings, db)
    providers = ProviderRegistry([FixtureProvider()], default=settings.provider)
    tools = ToolRegistry(builtin_tools())
    executor = Executor(
        sessions=sessions,
        providers=providers,
        tools=tools,
        worker_id=worker_id(),
        sandbox_root=settings.sandbox_root,
        max_steps=settings.max_steps,
    )
    return Runtime(settings=settings, db=db, sessions=sessions, executor=executor)
