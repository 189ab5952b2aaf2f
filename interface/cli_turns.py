"""``turnlog turns …`` and ``turnlog tool-calls …``: operator actions on turns and calls."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from turnlog.application.runtime import Runtime
from turnlog.application.views import describe_turn
from turnlog.interface.terminal import default_actor, fail, out, parse_uuid, run

turns_app = typer.Typer(help="Operator actions on turns and tool calls.", no_args_is_help=True)
tool_calls_app = typer.Typer(help="Approve or reject proposed tool calls.", no_args_is_help=True)


@turns_app.command("abandon")
def turns_abandon(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    turn_id: Annotated[str, typer.Argument(help="Turn id.")],
    reason: Annotated[str, typer.Option(help="Why the turn is given up (recorded).")],
    actor: Annotated[str, typer.Option(help="Who decides (recorded).")] = "",
) -> None:
    """Abandon an interrupted turn. Nothing already done outside is undone."""
    sid = parse_uuid(session_id)
    written = run(ctx, lambda rt: rt.abandon_turn(sid, turn_id, reason, actor or default_actor()))
    out.print(f"turn {turn_id} abandoned (position {written.position})")


@turns_app.command("resolve")
def turns_resolve(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    call_id: Annotated[str, typer.Argument(help="Tool call id.")],
    outcome: Annotated[str, typer.Option(help="succeeded or failed: what really happened.")],
    result: Annotated[str, typer.Option(help="The call's real result, as JSON.")],
    note: Annotated[str, typer.Option(help="How the outcome was established (recorded).")] = "",
    actor: Annotated[str, typer.Option(help="Who decides (recorded).")] = "",
    resume: Annotated[
        bool, typer.Option(help="Continue the turn here once every call is known.")
    ] = True,
) -> None:
    """Record the real outcome of a tool call whose outcome is unknown, then continue the turn."""
    sid = parse_uuid(session_id)
    try:
        value = json.loads(result)
    except json.JSONDecodeError as exc:
        fail(2, f"--result is not valid JSON: {exc.msg}")
    note = note or f"resolved as {outcome} from the command line"

    def resolve(rt: Runtime) -> int:
        turn, written = rt.resolve_tool_call(
            sid, call_id, outcome, value, note, actor or default_actor()
        )
        out.print(f"call {call_id} resolved as {outcome} (position {written.position})")
        if turn.state != "running" or not resume:
            return 0
        if rt.drive(sid) is None:
            # A live process holds the session (serve's worker): it continues the
            # turn. The resolve is done; there is nothing here left to fail.
            out.print(f"turn {turn.turn_id} continued by a live process")
            return 0
        final = rt.sessions.turn_record(sid, turn.turn_id)[1]
        out.print(
            f"turn {final.turn_id} {final.state}" + (f": {final.reply}" if final.reply else "")
        )
        return 0 if final.state == "completed" else 1

    raise typer.Exit(run(ctx, resolve))


@turns_app.command("cancel")
def turns_cancel(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    turn_id: Annotated[str, typer.Argument(help="Turn id.")],
    reason: Annotated[str, typer.Option(help="Why the turn is stopped (recorded).")],
    actor: Annotated[str, typer.Option(help="Who decides (recorded).")] = "",
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Also kill a side-effecting call in flight (its outcome is unknown)."
        ),
    ] = False,
) -> None:
    """Cancel a turn: at once if queued or awaiting approval, else at its next step."""
    sid = parse_uuid(session_id)
    done, written = run(
        ctx, lambda rt: rt.cancel_turn(sid, turn_id, reason, actor or default_actor(), force)
    )
    out.print(
        f"turn {turn_id} {done if done == 'cancelled' else 'cancel requested'}"
        f" (position {written.position})"
    )


@tool_calls_app.command("approve")
def tool_calls_approve(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    call_id: Annotated[str, typer.Argument(help="Tool call id.")],
    note: Annotated[str, typer.Option(help="Why (recorded).")] = "",
    actor: Annotated[str, typer.Option(help="Who decides (recorded).")] = "",
    arguments: Annotated[
        str | None, typer.Option(help="Edited arguments as a JSON object (checked).")
    ] = None,
) -> None:
    """Let a proposed tool call start; a worker runs it."""
    sid = parse_uuid(session_id)
    edited = None
    if arguments is not None:
        try:
            edited = json.loads(arguments)
        except json.JSONDecodeError as exc:
            fail(2, f"--arguments is not valid JSON: {exc.msg}")
    turn, written = run(
        ctx,
        lambda rt: rt.approve_tool_call(sid, call_id, actor or default_actor(), note, edited),
    )
    out.print(
        f"call {call_id} approved; turn {turn.turn_id} {turn.state} (position {written.position})"
    )


@tool_calls_app.command("reject")
def tool_calls_reject(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    call_id: Annotated[str, typer.Argument(help="Tool call id.")],
    reason: Annotated[str, typer.Option(help="Why (recorded; the model is told).")],
    actor: Annotated[str, typer.Option(help="Who decides (recorded).")] = "",
) -> None:
    """Refuse a proposed tool call; the model is told the reason and the turn goes on."""
    sid = parse_uuid(session_id)
    turn, written = run(
        ctx, lambda rt: rt.reject_tool_call(sid, call_id, actor or default_actor(), reason)
    )
    out.print(
        f"call {call_id} rejected; turn {turn.turn_id} {turn.state} (position {written.position})"
    )


@turns_app.command("show")
def turns_show(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    turn_id: Annotated[str, typer.Argument(help="Turn id.")],
) -> None:
    """Inspect one turn: its calls, arguments, attempts, workers and times (JSON)."""
    sid = parse_uuid(session_id)

    def show(rt: Runtime) -> dict[str, Any]:
        session, turn = rt.sessions.turn_record(sid, turn_id)
        return describe_turn(session, turn)

    typer.echo(json.dumps(run(ctx, show)))
