"""``turnlog sessions …``: create sessions, send messages, show them."""

from __future__ import annotations

import json
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.markup import escape

from turnlog.application.forks import fork_session
from turnlog.application.runtime import Runtime
from turnlog.application.settings import split_names
from turnlog.application.tools.port import default_tools
from turnlog.application.views import describe_request, describe_session_summary, describe_turn
from turnlog.interface.cli_progress import StepPrinter
from turnlog.interface.terminal import (
    default_actor,
    err,
    fail,
    id_table,
    out,
    parse_uuid,
    print_table,
    run,
)

sessions_app = typer.Typer(help="Create sessions, send messages, show them.", no_args_is_help=True)


@sessions_app.command("new")
def sessions_new(
    ctx: typer.Context,
    title: Annotated[str, typer.Option(help="A title to find the session by.")] = "",
    system_prompt: Annotated[str, typer.Option(help="System prompt for every request.")] = "",
    provider: Annotated[str | None, typer.Option(help="Provider (default from settings).")] = None,
    model: Annotated[str | None, typer.Option(help="Model (default from settings).")] = None,
    tools: Annotated[
        str | None,
        typer.Option(
            help="Tools the model may call, comma-separated ('': none). Default: "
            "TURNLOG_DEFAULT_TOOLS, or all for the fixture provider and all but the demo "
            "tools (echo, sleep, append_file) for a real one."
        ),
    ] = None,
    max_turns: Annotated[
        int | None,
        typer.Option(
            "--context-max-turns",
            help="Context policy: at most this many turns after the latest summary in a"
            " request (default: TURNLOG_CONTEXT_MAX_TURNS; at least 1).",
        ),
    ] = None,
    max_chars: Annotated[
        int | None,
        typer.Option(
            "--context-max-chars",
            help="Context policy: summarise the oldest turns first when a request would be"
            " longer than this many characters (default: TURNLOG_CONTEXT_MAX_CHARS; at least"
            " 1000).",
        ),
    ] = None,
    approval_policy: Annotated[
        str | None,
        typer.Option(
            help="Which tool calls wait for an operator's approval: none, side_effecting or"
            " all (default: TURNLOG_APPROVAL_POLICY).",
        ),
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(
            help="Default deadline of the session's turns, in seconds (default:"
            " TURNLOG_TURN_DEADLINE_SECONDS, or none).",
        ),
    ] = None,
) -> None:
    """Create a session and print its id."""

    def create(rt: Runtime) -> None:
        chosen_provider = provider or rt.settings.provider
        available = rt.executor.tools.names()
        if tools is None:
            chosen = default_tools(available, chosen_provider, rt.settings.default_tool_names)
        else:
            chosen = split_names(tools)
        unknown = sorted(set(chosen) - set(available))
        if unknown:
            fail(2, f"unknown tools: {', '.join(unknown)} (known: {', '.join(available)})")
        written = rt.sessions.create_session(
            title=title,
            system_prompt=system_prompt,
            provider=chosen_provider,
            model=model or rt.settings.model,
            tools=chosen,
            tools_chosen=True,
            created_by=default_actor(),
            context_max_turns=rt.settings.context_max_turns if max_turns is None else max_turns,
            context_max_chars=rt.settings.context_max_chars if max_chars is None else max_chars,
            approval_policy=approval_policy or rt.settings.approval_policy,
            deadline_seconds=deadline,
        )
        out.print(str(written.session_id))

    run(ctx, create)


@sessions_app.command("send")
def sessions_send(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    message: Annotated[str, typer.Argument(help="The user message.")],
    idempotency_key: Annotated[str, typer.Option(help="Repeat-safe key for this message.")] = "",
    deadline: Annotated[
        float | None,
        typer.Option(help="Cancel the turn after this many seconds (default: the session's)."),
    ] = None,
    enqueue: Annotated[
        bool,
        typer.Option("--enqueue", help="Queue behind a queued or running turn, not refuse."),
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option("--progress/--no-progress", hidden=True, help="Default: stderr is a TTY."),
    ] = None,
) -> None:
    """Submit a message and run its turn in this process; print the reply."""
    sid = parse_uuid(session_id)

    def send(rt: Runtime) -> int:
        rt.executor.tools.load()  # the MCP servers, before the message is on record
        if err.is_terminal if progress is None else progress:
            rt.executor.observer = StepPrinter(err)
        sent = rt.send(sid, message, idempotency_key, enqueue=enqueue, deadline_seconds=deadline)
        if sent.recovered is not None:
            v = sent.recovered
            err.print(escape(f"recovered turn {v.turn_id} first: {v.decision} {v.detail}".rstrip()))
        turn = sent.turn
        if turn.state == "completed":
            out.print(turn.reply, markup=False)
            return 0
        if turn.state == "failed":
            err.print(f"[bold red]turn failed:[/] {escape(turn.error)}")
            return 1
        if turn.state == "interrupted":
            session = rt.sessions.turn_record(sid, turn.turn_id)[0]
            calls = ", ".join(f"{c.call_id} ({c.name})" for c in session.unknown_calls(turn))
            err.print(
                f"[bold red]turn {turn.turn_id} interrupted;[/] unknown calls: {escape(calls)}"
            )
            return 3
        if turn.state == "queued":
            err.print(f"turn {turn.turn_id} queued behind the session's open turn")
            return 0
        err.print(f"turn {turn.turn_id} is {turn.state} (another process owns the session)")
        return 0

    code = run(ctx, send)
    raise typer.Exit(code)


@sessions_app.command("show")
def sessions_show(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    latest: Annotated[
        int, typer.Option("--latest", min=1, max=1000, help="How many of the latest turns.")
    ] = 20,
    show_all: Annotated[
        bool, typer.Option("--all", help="Every turn (read page by page), not just the latest.")
    ] = False,
) -> None:
    """Show a session rebuilt from its events: its latest turns, or --all of them."""
    sid = parse_uuid(session_id)
    view = run(ctx, lambda rt: _session_with_turns(rt, sid, None if show_all else latest))
    if as_json:
        typer.echo(json.dumps(view))
        return
    title = escape(view["title"] or "(untitled)")
    out.print(f"[bold]{title}[/]  {view['session_id']}  status={view['status']}")
    if view["forked_from"]:
        source = view["forked_from"]
        out.print(f"forked from {source['session_id']} at version {source['version']}")
    hidden = view["turn_count"] - len(view["turns"])
    if hidden:
        out.print(f"({hidden} earlier turns not shown; --all shows every turn)")
    if view["compaction"]:
        c = view["compaction"]
        out.print(f"context summary of the first {c['turns']} turns: {escape(c['summary'])}")
    for t in view["turns"]:
        out.print(f"\n[bold]turn {t['turn_id']}[/] ({t['state']})")
        lines = [f"  user: {t['message']}"]
        for c in t["tool_calls"]:
            lines.append(
                f"  tool {c['name']} {json.dumps(c['arguments'])} → {c['state']}"
                f" (attempt {c['attempt']}, call {c['call_id']})"
            )
            lines += [probe_line(p) for p in c.get("probes", [])]
        if t["reply"]:
            lines.append(f"  assistant: {t['reply']}")
        if t["error"]:
            lines.append(f"  error: {t['error']}")
        out.print("\n".join(lines), markup=False)


@sessions_app.command("request")
def sessions_request(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    version: Annotated[int, typer.Option("--version", help="The session version to rebuild at.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The model request the runtime would have sent at --version, rebuilt from the events."""
    sid = parse_uuid(session_id)
    request = run(ctx, lambda rt: rt.sessions.request_at(sid, version))
    view = describe_request(sid, version, request)
    if as_json:
        typer.echo(json.dumps(view))
        return
    tools = ", ".join(view["tools"]) or ("none" if view["tools_chosen"] else "every tool")
    out.print(
        f"request at version {version}: {view['provider']}/{view['model']},"
        f" turn {view['turn']}, tools: {tools}",
        markup=False,
    )
    for m in view["messages"]:
        head = m["role"] + (f" ({m['tool_call_id']})" if m["tool_call_id"] else "")
        lines = [f"{head}: {m['content']}"]
        lines += [f"  calls {json.dumps(c)}" for c in m["tool_calls"]]
        out.print("\n".join(lines), markup=False)


@sessions_app.command("fork")
def sessions_fork(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="The session to fork.")],
    version: Annotated[
        int, typer.Option("--version", help="Its version to fork at (between turns).")
    ],
    title: Annotated[
        str | None, typer.Option(help="The fork's title (default: the source's).")
    ] = None,
    metadata: Annotated[
        str | None,
        typer.Option(help="The fork's metadata as a JSON object (default: the source's)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the new session as JSON.")] = False,
) -> None:
    """Start a new session from another as it was at --version, and print its id.

    Its next model request is the source's at that version (``sessions request``);
    the source is only read. A version inside an unfinished turn exits 3.
    """
    sid = parse_uuid(session_id)
    fields: dict[str, Any] | None = None
    if metadata is not None:
        try:
            fields = json.loads(metadata)
        except ValueError:
            fail(2, "--metadata is not JSON")
        if not isinstance(fields, dict):
            fail(2, "--metadata must be a JSON object")
        if any(str(k).startswith("turnlog.") for k in fields):
            fail(2, "metadata keys starting with 'turnlog.' are reserved")

    def forked(rt: Runtime) -> dict[str, Any]:
        written = fork_session(
            rt.sessions, sid, version, title=title, metadata=fields, created_by=default_actor()
        )
        return describe_session_summary(rt.sessions.get_session(written.session_id))

    view = run(ctx, forked)
    if as_json:
        typer.echo(json.dumps(view))
        return
    out.print(str(view["session_id"]))


def probe_line(probe: dict[str, Any]) -> str:
    """One probe run of a call, as ``sessions show`` prints it."""
    note = f": {probe['note']}" if probe["note"] else ""
    return (
        f"    probe (attempt {probe['attempt']}) answered {probe['answer']}"
        f" in {probe['duration_seconds']:.3f}s{note}; evidence {json.dumps(probe['evidence'])}"
    )


def _session_with_turns(rt: Runtime, sid: UUID, latest: int | None) -> dict[str, Any]:
    """The session's summary and its turns, oldest first: the ``latest`` ones, or all."""
    view = describe_session_summary(rt.sessions.get_session(sid))
    turns: list[dict[str, Any]] = []
    before: int | None = None
    while latest is None or len(turns) < latest:
        size = 200 if latest is None else latest - len(turns)
        _, page, before = rt.sessions.turn_page(sid, before, size)
        turns.extend(describe_turn(record, turn) for record, turn in page)
        if before is None:
            break
    view["turns"] = turns[::-1]
    return view


@sessions_app.command("list")
def sessions_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    search: Annotated[
        str | None,
        typer.Option(help="Only sessions whose id or title starts with this (read model)."),
    ] = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE its metadata must hold (repeatable; read model)."),
    ] = None,
    cursor: Annotated[
        str | None, typer.Option(help="Go on from a search's printed next cursor.")
    ] = None,
    forked_from: Annotated[
        str | None, typer.Option(help="Only the forks of this session (read model).")
    ] = None,
) -> None:
    """List sessions in the order they were created.

    With --search, --metadata or --forked-from: the matching sessions from the
    sessions read model, most recent activity first, a page of --limit (at most 500).
    """
    if search is not None or metadata or cursor is not None or forked_from is not None:
        _search(ctx, search, metadata or [], cursor, min(limit, 500), as_json, forked_from)
        return

    def listing(rt: Runtime) -> list[dict[str, Any]]:
        rows = []
        for sid in rt.sessions.session_ids(limit=limit):
            s = rt.sessions.get_session(sid)
            rows.append(
                {"id": str(sid), "title": s.title, "status": s.status, "turns": s.turn_count}
            )
        return rows

    rows = run(ctx, listing)
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = id_table("session", "title", "status", "turns")
    for row in rows:
        table.add_row(row["id"], escape(row["title"]), row["status"], str(row["turns"]))
    print_table(table)


def _search(
    ctx: typer.Context,
    search: str | None,
    metadata: list[str],
    cursor: str | None,
    limit: int,
    as_json: bool,
    forked_from: str | None = None,
) -> None:
    from turnlog.interface.cli_read import _with_read_models

    pairs: list[tuple[str, str]] = []
    for item in metadata:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(2, f"--metadata takes KEY=VALUE, not {item!r}")
        pairs.append((key, value))
    rows, following = _with_read_models(
        ctx,
        lambda rt, models: models.list_sessions(
            limit=limit, cursor=cursor, search=search, metadata=pairs, forked_from=forked_from
        ),
    )
    if as_json:
        typer.echo(json.dumps({"items": rows, "next_cursor": following}))
        return
    table = id_table("session", "title", "status", "turns")
    for row in rows:
        title = escape(row["title"] or "")
        table.add_row(row["session_id"], title, row["status"], str(row["turn_count"]))
    print_table(table)
    if following:
        err.print(f"more: --cursor {following}", markup=False)
