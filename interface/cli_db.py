"""``turnlog db …``: prepare and inspect the database."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from turnlog.interface.terminal import ctx_of, fail, out, run

db_app = typer.Typer(help="Prepare and inspect the database.", no_args_is_help=True)


@db_app.command("init")
def db_init(ctx: typer.Context) -> None:
    """Create or migrate the namespace's schema and tables (safe to run again)."""
    ctx_of(ctx).owns_schema = True
    rt = run(ctx, lambda rt: rt)
    out.print(
        f"namespace {rt.settings.namespace} ready in schema {rt.settings.schema_name} "
        f"({rt.db.describe()})"
    )


@db_app.command("status")
def db_status(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Server, version, namespace, event count and last position."""
    from turnlog.application.store.database import namespace_status

    status = run(ctx, lambda rt: namespace_status(rt.db, rt.settings.namespace))
    if as_json:
        typer.echo(json.dumps(status, default=str))
        return
    for key, value in status.items():
        out.print(f"{key:>14}: {value}")


@db_app.command("stop")
def db_stop(ctx: typer.Context) -> None:
    """Stop the embedded PostgreSQL of the data directory (it otherwise keeps running)."""
    from turnlog.application.store.database import stop_embedded

    settings = ctx_of(ctx).settings()
    if settings.namespace_database_url:
        fail(2, "TURNLOG_DATABASE_URL is set: turnlog does not stop an external server")
    stopped = stop_embedded(settings.data_dir)
    out.print("embedded PostgreSQL stopped" if stopped else "no embedded PostgreSQL was running")
