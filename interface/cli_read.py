"""The read side of the ``turnlog`` command: ``projections …`` and ``audit``.

Registered by ``interface.cli``; it reaches the process's settings and
runtime through the root context object that ``cli.main`` installs, so this
module does not import ``interface.cli`` (which imports it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Annotated, Any, Protocol, TypeVar
from uuid import UUID

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.tenants import scoped_settings
from turnlog.interface.bootstrap import Process, build_process, tune_collector
from turnlog.interface.roles import Role
from turnlog.interface.terminal import (
    err,
    fail,
    id_table,
    out,
    print_table,
    refusals,
    stop_on_signals,
)
from turnlog.projections import ReadModels, read_models
from turnlog.projections import audit as audits
from turnlog.projections.rebuild import HORIZON_WAIT, rebuild, verify
from turnlog.projections.status import describe_horizon

T = TypeVar("T")
log = logging.getLogger("turnlog.projections")

projections_app = typer.Typer(
    help="Read models: run them, see their status, rebuild and verify them.",
    no_args_is_help=True,
)


class _Root(Protocol):
    """What ``interface.cli.Context`` offers the commands."""

    def settings(self) -> Settings: ...

    def runtime(self) -> Runtime: ...

    def process(self) -> Process: ...


def _root(ctx: typer.Context) -> _Root:
    obj: _Root = ctx.find_root().obj
    return obj


def _with_read_models(ctx: typer.Context, action: Callable[[Runtime, ReadModels], T]) -> T:
    with refusals():
        process = _root(ctx).process()
        models = process.reads()
        assert process.runtime is not None
        return action(process.runtime, models)


NameArgument = Annotated[
    str | None, typer.Argument(help="sessions, open_turns or tool_calls (default: all).")
]


@projections_app.command("run")
def projections_run(
    ctx: typer.Context,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Run only this read model (repeatable).")
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Events per transaction.")] = 500,
    poll_interval: Annotated[
        float, typer.Option(min=0.05, max=1.0, help="Longest wait between reads of the log (s).")
    ] = 0.5,
    metrics_port: Annotated[
        int, typer.Option(min=0, max=65535, help="Serve /metrics on this port (0: off).")
    ] = 0,
    metrics_host: Annotated[str, typer.Option(help="Address for --metrics-port.")] = "127.0.0.1",
) -> None:
    """Keep the read models up to date until SIGTERM or SIGINT (hot standby if another runs)."""
    from turnlog.interface.logs import configure_logging
    from turnlog.interface.metrics import MetricsServer

    settings = _root(ctx).settings()
    configure_logging(settings)
    with refusals():
        scoped = scoped_settings(settings)  # a tenants file: runners for each namespace
    processes = [
        build_process(
            s, Role.PROJECTIONS, only=only, batch_size=batch_size, poll_interval=poll_interval
        )
        for s in scoped
    ]
    tune_collector()
    metrics = MetricsServer(processes[0], processes[1:])
    if metrics_port:  # before the database: a busy port fails fast
        metrics.start_or_exit(metrics_host, metrics_port)
    stop = stop_on_signals()
    try:
        with refusals():
            for process in processes:
                process.start()
                assert process.supervisor is not None
                names = ", ".join(m.name for m in process.supervisor.models)
                log.info(
                    "running read models %s in namespace %s", names, process.settings.namespace
                )
        while not stop.wait(0.5):
            pass
    finally:
        metrics.stop()
        for process in processes:
            process.stop()
    log.info("stopped")


@projections_app.command("status")
def projections_status(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Each read model's position, the log head, lag, and whether a runner holds it.

    With a tenants file (TURNLOG_TENANTS_FILE), those of every namespace in it."""
    settings = _root(ctx).settings()
    if settings.tenants_file is None:
        rows = _with_read_models(ctx, lambda rt, models: models.status())
    else:
        rows = _every_namespaces_status(settings)
    if as_json:
        typer.echo(json.dumps(rows))
        return
    several = settings.tenants_file is not None
    head = ("namespace",) if several else ()
    table = id_table(*head, "read model", "position", "head", "lag (events)", "lag (s)", "runner")
    for r in rows:
        lag_s = "?" if r["lag_seconds"] is None else f"{r['lag_seconds']:.1f}"
        runner = r["holder"] if r["running"] else "[yellow]none[/]"
        cells = (r["name"], str(r["position"]), str(r["head"]), str(r["lag_events"]), lag_s, runner)
        table.add_row(*((r["namespace"],) if several else ()), *cells)
    print_table(table)
    if rows:
        typer.echo(describe_horizon(rows[0]))


def _every_namespaces_status(settings: Settings) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with refusals():
        for scoped in scoped_settings(settings):
            process = build_process(scoped, None).start()
            try:
                rows += [{"namespace": scoped.namespace, **r} for r in process.reads().status()]
            finally:
                process.stop()
    return rows


class _RateColumn(ProgressColumn):
    """Events per second."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-- events/s" if speed is None else f"{speed:,.0f} events/s")


@projections_app.command("rebuild")
def projections_rebuild(
    ctx: typer.Context,
    name: NameArgument = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Events per transaction.")] = 2000,
    wait: Annotated[float, typer.Option(min=0, help="Wait this long for runners (s).")] = 0.0,
    horizon_wait: Annotated[
        float,
        typer.Option(
            min=0,
            help="Wait this long for events held back by an older open transaction (s);"
            " past it, the runners fold them once it ends.",
        ),
    ] = HORIZON_WAIT,
) -> None:
    """Rebuild read models from position 0, holding their runner locks."""
    with refusals():
        models = read_models(name)
    bar = _ProgressBar()

    def held(holder: dict[str, Any]) -> None:
        err.print(f"waiting for events held back: {_holder_text(holder)}")

    def act(rt: Runtime, read: ReadModels) -> Any:
        with bar:
            return rebuild(
                read.events,
                rt.db,
                rt.settings.namespace,
                models,
                batch_size=batch_size,
                wait=wait,
                progress=bar.update,
                horizon_wait=horizon_wait,
                held=held,
            )

    started = time.monotonic()
    done = _with_read_models(ctx, act)
    out.print(
        f"rebuilt {', '.join(done.names)}: {done.events} events to position {done.position} "
        f"in {time.monotonic() - started:.2f}s ({done.events_per_second:,.0f} events/s)"
    )
    if done.held_back:
        err.print(
            f"[bold]not at the head:[/] {done.held_back} event(s) committed before the rebuild"
            f" are still held back ({_holder_text(done.holder)}); the runners fold them when"
            " that transaction ends"
        )


def _holder_text(holder: dict[str, Any]) -> str:
    """The horizon's holder as ``describe_horizon`` words it for a status row."""
    return describe_horizon(
        {"horizon_age_seconds": holder.get("age_seconds"), "horizon_pid": holder.get("pid")}
    )


class _ProgressBar:
    """Events done, events/s and ETA; shown from the first report (once the locks are held)."""

    def __init__(self) -> None:
        self._progress = Progress(
            TextColumn("[bold]rebuild[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("events"),
            _RateColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=err,
        )
        self._task: Any = None

    def update(self, done: int, total: int) -> None:
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task("rebuild", total=total)
        self._progress.update(self._task, completed=done, total=total)

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


@projections_app.command("verify")
def projections_verify(
    ctx: typer.Context,
    name: NameArgument = None,
    show: Annotated[int, typer.Option(min=1, help="Differences shown per read model.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Compare the live tables row by row with the log folded in memory; exit 1 on a difference.

    Each read model is compared at its own position; how far the log's head is
    past it (its lag, not a difference) is reported beside it.
    """

    def run(rt: Any, models: Any) -> tuple[list[Any], dict[str, Any]]:
        results = verify(models.events, read_models(name))
        return results, {r["name"]: r for r in models.status()}

    results, status = _with_read_models(ctx, run)
    if as_json:
        typer.echo(json.dumps([_verified(r, status.get(r.name, {}), show) for r in results]))
    else:
        for result in results:
            _print_verified(result, status.get(result.name, {}), show)
    if not all(r.ok for r in results):
        raise typer.Exit(1)


def _verified(result: Any, status: dict[str, Any], show: int) -> dict[str, Any]:
    return {
        "name": result.name,
        "ok": result.ok,
        "position": result.position,
        "rows": result.rows,
        "head": status.get("head"),
        "lag_events": status.get("lag_events"),
        "lag_seconds": status.get("lag_seconds"),
        "differences": [d.describe() for d in result.differences[:show]],
        "difference_count": len(result.differences),
    }


def _print_verified(result: Any, status: dict[str, Any], show: int) -> None:
    lag = status.get("lag_events")
    behind = "" if not lag else f"; [yellow]{lag} event(s) behind the log's head[/] (not compared)"
    if result.ok:
        out.print(f"{result.name}: OK ({result.rows} rows at position {result.position}{behind})")
        return
    out.print(
        f"[bold red]{result.name}: {len(result.differences)} difference(s)[/] "
        f"at position {result.position}{behind}"
    )
    for difference in result.differences[:show]:
        out.print(f"  {escape(difference.describe())}")


def audit(
    ctx: typer.Context,
    session_id: Annotated[str | None, typer.Argument(help="Session id.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    verify_stream: Annotated[
        bool, typer.Option("--verify", help="Check the stream is whole and read models agree.")
    ] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict", help="With --verify: exit 1 when a read model could not be compared."
        ),
    ] = False,
    whole_log: Annotated[bool, typer.Option("--log", help="Page the whole log instead.")] = False,
    after: Annotated[int, typer.Option(min=0, help="With --log: after this position.")] = 0,
    limit: Annotated[int, typer.Option(min=1, max=10000, help="With --log: how many.")] = 100,
    show_head: Annotated[
        bool, typer.Option("--head", help="Print the stream's head hash (keep it elsewhere).")
    ] = False,
    chain_existing: Annotated[
        bool,
        typer.Option(
            "--chain-existing", help="Hash, once, every stream stored before events were chained."
        ),
    ] = False,
    accept_unchained: Annotated[
        bool,
        typer.Option(
            "--accept-unchained",
            help="With --verify: a stream stored before the chain is not a failure.",
        ),
    ] = False,
) -> None:
    """Show a session's stored events (or the whole log) as stored; --verify proves it whole."""
    if chain_existing:
        if session_id is not None or whole_log:
            fail(2, "--chain-existing takes no SESSION_ID and no --log")
        _chain_existing(ctx)
        return
    if whole_log == (session_id is not None):
        fail(2, "give either a SESSION_ID or --log")
    if whole_log:
        records = _with_read_models(ctx, lambda rt, m: audits.log_page(m.events, after, limit))
        _print_records(records, as_json, whole_log=True)
        if records and not as_json:
            err.print(f"next page: --log --after {records[-1].position}")
        return
    try:
        sid = UUID(str(session_id))
    except ValueError:
        fail(4, f"session id {session_id!r} is not a valid id; no such session")
    if show_head:
        _head(ctx, sid, as_json)
        return
    if verify_stream:
        _verify(ctx, sid, strict, accept_unchained)
        return
    records = _with_read_models(ctx, lambda rt, m: audits.stream(m.events, sid))
    if not records:
        fail(4, f"session {sid} has no stored events [session_not_found]")
    _print_records(records, as_json, whole_log=False)


def _head(ctx: typer.Context, sid: UUID, as_json: bool) -> None:
    version, digest, broken = _with_read_models(ctx, lambda rt, m: audits.head(m.events, sid))
    if broken:
        for problem in broken:
            err.print(f"problem: {escape(problem)}")
        fail(1, f"session {sid} (version {version}): its chain is broken; no head to keep")
    if as_json:
        print(
            json.dumps(
                {"session_id": str(sid), "version": version, "hash": digest and digest.hex()}
            )
        )
    elif digest is not None:
        print(f"{digest.hex()}  {sid} version {version}")
    else:
        err.print(
            f"session {sid} (version {version}) is unchained: its events were stored before"
            " events were chained; run `turnlog audit --chain-existing` once"
        )
    if digest is None:
        raise typer.Exit(1)


def _chain_existing(ctx: typer.Context) -> None:
    def progress(done: Any, index: int, total: int) -> None:
        what = (
            f"refused: {escape(done.refused)}"
            if done.refused
            else f"{done.events} event(s) chained"
        )
        err.print(f"[{index}/{total}] session {done.session_id}: {what}")

    found = _with_read_models(ctx, lambda rt, m: audits.chain_existing(m.events, progress))
    chained = [c for c in found if not c.refused]
    refused = [c for c in found if c.refused]
    if not found:
        out.print("nothing to chain: every stored event carries its hash")
        return
    events = sum(c.events for c in chained)
    out.print(f"chained {events} event(s) in {len(chained)} session(s)")
    if refused:
        names = ", ".join(str(c.session_id) for c in refused)
        fail(1, f"not chained, their chain exists and is broken: {names}")


def _verify(ctx: typer.Context, sid: UUID, strict: bool, accept_unchained: bool) -> None:
    result = _with_read_models(
        ctx, lambda rt, m: audits.verify_stream(m.events, sid, accept_unchained)
    )
    for note in result.notes:
        err.print(f"note: {escape(note)}")
    for line in result.compared:
        out.print(f"compared: {escape(line)}")
    for line in result.not_compared:
        out.print(f"[yellow]not compared:[/] {escape(line)}")
    if not result.ok:
        for problem in result.problems:
            out.print(f"[bold red]problem:[/] {escape(problem)}")
        raise typer.Exit(1)
    agree = (
        "every read model agrees"
        if result.complete
        else f"{len(result.not_compared)} comparison(s) could not be made"
    )
    out.print(
        f"OK: session {sid}: {result.events} events, versions 1..{result.events} without gaps,"
        f" all decode, the aggregate replays; {agree}"
    )
    if strict and not result.complete:
        raise typer.Exit(1)


def _print_records(records: list[audits.StoredRecord], as_json: bool, whole_log: bool) -> None:
    if as_json:
        for r in records:
            print(json.dumps(r.as_json(), ensure_ascii=False, default=str))
        return
    if not whole_log and records:
        out.print(f"session {records[0].session_id}: {len(records)} stored events")
    table = Table(show_lines=True)
    table.add_column("position", justify="right", no_wrap=True)
    if whole_log:
        table.add_column("session", overflow="fold")
    table.add_column("version", justify="right", no_wrap=True)
    table.add_column("topic", overflow="fold")
    table.add_column("recorded", overflow="fold")
    table.add_column("payload", overflow="fold", ratio=1)
    for r in records:
        recorded = Text(r.recorded_at.isoformat()) if r.recorded_at else Text(r.error, style="red")
        payload = Text(json.dumps(r.payload, ensure_ascii=False, default=str))
        cells: list[Any] = [str(r.position)]
        if whole_log:
            cells.append(str(r.session_id))
        cells += [str(r.version), Text(r.topic), recorded, payload]
        table.add_row(*cells)
    out.print(table)
