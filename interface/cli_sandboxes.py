"""``turnlog sandboxes``: see the tool sandboxes of this host, and collect what is left over."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from turnlog.application.runtime import Runtime
from turnlog.application.tools.containment import Containment, check_host
from turnlog.application.tools.sandboxes import Action, Sandbox, Sandboxes
from turnlog.interface.terminal import out, print_table, run

sandboxes_app = typer.Typer(
    help="Tool sandboxes on this host: list them, collect leftovers, check the sandbox.",
    no_args_is_help=True,
)


def _sandboxes(rt: Runtime) -> Sandboxes:
    return Sandboxes(rt.sessions, rt.settings.sandbox_root)


@sandboxes_app.command("list")
def sandboxes_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Each session's sandbox: path, size, the session's state and its live tool processes."""
    found: list[Sandbox] = run(ctx, lambda rt: _sandboxes(rt).scan())
    if as_json:
        typer.echo(json.dumps([s.as_dict() for s in found]))
        return
    table = Table()
    table.add_column("session", no_wrap=True)
    for name in ("status", "size", "live processes"):
        table.add_column(name)
    table.add_column("path", overflow="fold")
    for s in found:
        pids = ", ".join(
            f"{p.process.pid} ({p.tool}, {'orphaned' if p.orphaned else p.call_state})"
            for p in s.processes
        )
        table.add_row(s.session_id, s.status, _human(s.size_bytes), pids or "-", str(s.path))
    print_table(table)


@sandboxes_app.command("gc")
def sandboxes_gc(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be done.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Kill orphaned tool process groups; remove sandboxes of closed sessions.

    Processes of a call whose outcome is unknown (an interrupted turn) are kept
    until the turn is abandoned or the call resolved.
    """
    actions: list[Action] = run(ctx, lambda rt: _sandboxes(rt).gc(dry_run=dry_run))
    if as_json:
        typer.echo(json.dumps([a.as_dict() for a in actions]))
        return
    for a in actions:
        out.print(f"{a.action:>12}  {a.target}  [session {a.session_id}: {a.reason}]", markup=False)
    if not actions:
        out.print("nothing to collect")


@sandboxes_app.command("check")
def sandboxes_check(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """What the tool sandbox can do on this host: one trial sandbox, what it saw inside.

    Exit code 0 when tool processes are sandboxed, 1 when they cannot be (or
    TURNLOG_SANDBOX=off). Needs no database.
    """
    enabled = ctx.find_root().obj.settings().sandbox == "on"
    host = check_host(Containment(enabled=enabled))
    if as_json:
        typer.echo(json.dumps(host.as_dict()))
    else:
        if host.ok:
            out.print(f"sandbox: on ({host.mode})", markup=False)
        else:
            out.print(f"sandbox: NOT available: {host.reason}", markup=False)
        for key, value in host.facts.items():
            out.print(f"  {key:>16}  {value}", markup=False)
    raise typer.Exit(0 if host.ok else 1)


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
