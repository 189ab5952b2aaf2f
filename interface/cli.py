"""The ``turnlog`` command.

Each invocation is its own process: two invocations in a row are already a
restart, and everything the second one knows comes from the stored events.
"""

from __future__ import annotations

import getpass
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

import typer
from pydantic import ValidationError
from rich.markup import escape

from turnlog import __version__
from turnlog.application.errors import ConfigurationError
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings, split_names
from turnlog.application.tools.port import default_tools
from turnlog.application.views import describe_request, describe_session_summary, describe_turn
from turnlog.interface import cli_work
from turnlog.interface.bootstrap import Process, build_process
from turnlog.interface.cli_read import audit, projections_app
from turnlog.interface.cli_sandboxes import sandboxes_app
from turnlog.interface.cli_tools import tools_app
from turnlog.interface.demo import demo_app
from turnlog.interface.serve import serve
from turnlog.interface.terminal import err, fail, id_table, out, print_table, run

app = typer.Typer(
    help="turnlog: an agent runtime whose sessions are event streams in PostgreSQL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
sessions_app = typer.Typer(help="Create sessions, send messages, show them.", no_args_is_help=True)
turns_app = typer.Typer(help="Operator actions on turns and tool calls.", no_args_is_help=True)
db_app = typer.Typer(help="Prepare and inspect the database.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")
app.add_typer(turns_app, name="turns")
tool_calls_app = typer.Typer(help="Approve or reject proposed tool calls.", no_args_is_help=True)
app.add_typer(tool_calls_app, name="tool-calls")
app.add_typer(db_app, name="db")
app.add_typer(demo_app, name="demo")
app.add_typer(sandboxes_app, name="sandboxes")
app.add_typer(tools_app, name="tools")
app.add_typer(projections_app, name="projections")
app.command("audit")(audit)
app.command("serve")(serve)
app.command("worker")(cli_work.worker)
app.command("check")(cli_work.check)
app.command("workers")(cli_work.workers)


@dataclass
class Context:
    """Settings overrides from the global flags; the command's process is built on first use."""

    overrides: dict[str, Any] = field(default_factory=dict)
    _settings: Settings | None = None
    _process: Process | None = None
    owns_schema: bool = False  # a one-shot command never migrates the tables; ``db init`` does

    def settings(self) -> Settings:
        if self._settings is None:
            try:
                self._settings = Settings(**self.overrides)
            except ValidationError as exc:
                fail(2, "invalid settings: " + "; ".join(e["msg"] for e in exc.errors()))
        return self._settings

    def process(self) -> Process:
        """The one-shot command's process (runtime; read models on first use), started."""
        if self._process is None:
            try:
                process = build_process(self.settings(), None)
                process.owns_schema = self.owns_schema
                self._process = process.start()
            except ConfigurationError as exc:
                fail(2, f"invalid configuration: {exc.detail}")
        return self._process

    def runtime(self) -> Runtime:
        runtime = self.process().runtime
        assert runtime is not None
        return runtime

    def close(self) -> None:
        if self._process is not None:
            self._process.stop()


def ctx_of(ctx: typer.Context) -> Context:
    obj = ctx.find_root().obj
    assert isinstance(obj, Context)
    return obj


def parse_uuid(value: str, what: str = "session id") -> UUID:
    try:
        return UUID(value)
    except ValueError:
        fail(4, f"{what} {value!r} is not a valid id; no such session")


def default_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"turnlog {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    namespace: Annotated[
        str | None, typer.Option(help="Namespace (env TURNLOG_NAMESPACE).")
    ] = None,
    database_url: Annotated[
        str | None, typer.Option(help="PostgreSQL URL (env TURNLOG_DATABASE_URL); unset: embedded.")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Local state directory (env TURNLOG_DATA_DIR).")
    ] = None,
) -> None:
    """turnlog: sessions as event streams in PostgreSQL."""
    overrides = {
        k: v
        for k, v in {
            "namespace": namespace,
            "database_url": database_url,
            "data_dir": data_dir,
        }.items()
        if v is not None
    }
    state = Context(overrides)
    ctx.obj = state
    ctx.call_on_close(state.close)


# ---------------------------------------------------------------- sessions


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
        )
        out.print(str(written.session_id))

    run(ctx, create)


@sessions_app.command("send")
def sessions_send(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    message: Annotated[str, typer.Argument(help="The user message.")],
    idempotency_key: Annotated[str, typer.Option(help="Repeat-safe key for this message.")] = "",
) -> None:
    """Submit a message and run its turn in this process; print the reply."""
    sid = parse_uuid(session_id)

    def send(rt: Runtime) -> int:
        rt.executor.tools.load()  # the MCP servers, before the message is on record
        sent = rt.send(sid, message, idempotency_key)
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
) -> None:
    """List sessions in the order they were created."""

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


# ---------------------------------------------------------------- turns


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


# ---------------------------------------------------------------- db


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
    if settings.database_url:
        fail(2, "TURNLOG_DATABASE_URL is set: turnlog does not stop an external server")
    stopped = stop_embedded(settings.data_dir)
    out.print("embedded PostgreSQL stopped" if stopped else "no embedded PostgreSQL was running")


def entrypoint() -> None:
    """Console script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
