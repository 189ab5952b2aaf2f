"""``turnlog sessions purge`` and ``turnlog retention run``: the deletions of stored events."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer
from rich.markup import escape

from turnlog.application.retention import Due
from turnlog.interface.bootstrap import Process
from turnlog.interface.cli_sessions import sessions_app
from turnlog.interface.purging import build_purger, build_retention
from turnlog.interface.terminal import err, fail, out, parse_uuid, refusals

retention_app = typer.Typer(
    help="Purge sessions closed longer ago than TURNLOG_RETENTION_DAYS.", no_args_is_help=True
)
T = TypeVar("T")


def _on_process(ctx: typer.Context, action: Callable[[Process], T]) -> T:
    with refusals():
        return action(ctx.find_root().obj.process())


@sessions_app.command("purge")
def sessions_purge(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="The session to purge.")],
    reason: Annotated[str, typer.Option(help="Why (kept in the purge record).")],
    actor: Annotated[str, typer.Option(help="Who decides (kept in the purge record).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
) -> None:
    """Delete a session's events, snapshots, read-model rows and sandbox; keep a record.

    Refused while a turn is open. A purge stopped halfway is finished by running it again.
    """
    sid = parse_uuid(session_id)

    def purge(process: Process) -> dict[str, object]:
        assert process.runtime is not None
        purger = build_purger(process.runtime, process.reads())
        return purger.purge(sid, reason, actor).as_dict()

    record = _on_process(ctx, purge)
    if as_json:
        typer.echo(json.dumps(record))
        return
    out.print(
        f"purged session {record['session_id']}: {record['events']} events, last version"
        f" {record['head_version']}, head hash {record['head_hash'] or '(unchained)'}"
    )


@retention_app.command("run")
def retention_run(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would go.")] = False,
    days: Annotated[
        int | None,
        typer.Option(min=1, help="Override TURNLOG_RETENTION_DAYS for this run."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Purge every session closed and inactive for more than the retention period."""
    root = ctx.find_root().obj
    days = days or root.settings().retention_days
    if days is None:
        fail(2, "no retention period: set TURNLOG_RETENTION_DAYS or pass --days")

    def progress(item: Due, index: int, total: int) -> None:
        if as_json:
            return
        verb = "would purge" if dry_run else ("refused" if item.error else "purged")
        detail = f": {item.error}" if item.error else ""
        events = f", {item.events} events" if item.events is not None else ""
        err.print(
            f"[{index}/{total}] {verb} {item.session_id} (last active"
            f" {item.last_activity_at:%Y-%m-%d}{events}){escape(detail)}"
        )

    def run(process: Process) -> list[Due]:
        assert process.runtime is not None and days is not None
        retention = build_retention(process.runtime, process.reads(), days)
        return retention.run(dry_run=dry_run, progress=progress)

    done = _on_process(ctx, run)
    if as_json:
        typer.echo(json.dumps([d.as_dict() for d in done]))
        return
    refused = [d for d in done if d.error]
    verb = "would be purged" if dry_run else "purged"
    out.print(
        f"{len(done) - len(refused)} session(s) {verb} (closed over {days} days ago)"
        + (f"; {len(refused)} refused" if refused else "")
    )
    if refused:
        raise typer.Exit(3)
