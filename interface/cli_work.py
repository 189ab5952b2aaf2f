"""``turnlog worker`` and ``turnlog check``: executing turns, and the restart check."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

import typer
from rich.markup import escape

from turnlog.application.execution.worker import check_open_turns
from turnlog.application.tenants import scoped_settings
from turnlog.interface.bootstrap import OpenTurnsSource, build_process, tune_collector
from turnlog.interface.roles import Role
from turnlog.interface.terminal import id_table, out, print_table, refusals, stop_on_signals

log = logging.getLogger("turnlog.worker")


def worker(
    ctx: typer.Context,
    concurrency: Annotated[int, typer.Option(min=1, max=256, help="Turns run at once.")] = 4,
    drain_timeout: Annotated[
        float, typer.Option(min=0, help="On SIGTERM, seconds to finish the current steps.")
    ] = 30.0,
    metrics_port: Annotated[
        int, typer.Option(min=0, max=65535, help="Serve /metrics on this port (0: off).")
    ] = 0,
    metrics_host: Annotated[str, typer.Option(help="Address for --metrics-port.")] = "127.0.0.1",
) -> None:
    """Run turns: pick up queued and orphaned turns until SIGTERM, then drain.

    Needs the open_turns read model kept by a projections runner
    (`turnlog projections run` or `turnlog serve --role projections`).
    """
    from turnlog.interface.logs import configure_logging
    from turnlog.interface.metrics import MetricsServer  # only the worker serves /metrics

    settings = ctx.find_root().obj.settings()
    configure_logging(settings)
    with refusals():
        scoped = scoped_settings(settings)  # a tenants file: a worker for each namespace
    processes = [build_process(s, Role.WORKER, worker_concurrency=concurrency) for s in scoped]
    tune_collector()
    metrics = MetricsServer(processes[0], processes[1:])
    for process, execution in zip(processes, metrics.executions, strict=True):
        process.observer = execution
    if metrics_port:  # before the database: a busy port fails fast
        metrics.start_or_exit(metrics_host, metrics_port)
    stop = stop_on_signals()
    for process in processes:
        process.start()  # logs "worker … started: <start-up check>"
    stop.wait()
    log.info("draining (up to %gs)…", drain_timeout)
    held = sum(p.worker.held for p in processes if p.worker is not None)
    for process in processes:
        process.stop(drain_timeout=drain_timeout)
    metrics.stop()
    log.info("worker stopped (%d turn(s) were held)", held)


def check(
    ctx: typer.Context,
    apply: Annotated[bool, typer.Option("--apply", help="Act on the decisions now.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    wait: Annotated[
        float, typer.Option(min=0, help="Longest wait for a running read-model runner (s).")
    ] = 10.0,
) -> None:
    """The restart check: every open turn and what recovery does with it.

    Open turns are listed by the open_turns read model, brought to the log's
    head first (here, or by its runner if one is running), so the list is
    true even when no projections process runs; how far behind it was is said.
    Exits 3 when an operator must act (a turn interrupted, or to be, by a call
    of unknown outcome; a proposed call awaiting approval), else 0.
    """
    from turnlog.projections.catalog import READ_MODELS
    from turnlog.projections.catch_up import catch_up

    root: Any = ctx.find_root().obj
    with refusals():
        process = root.process()
        runtime, read_models = process.runtime, process.reads()
        caught = catch_up(
            read_models.events,
            runtime.db,
            runtime.settings.namespace,
            READ_MODELS["open_turns"],
            wait,
        )
        verdicts = check_open_turns(runtime, OpenTurnsSource(read_models))
    from turnlog.application.execution.recovery import summarize

    if as_json and not apply:
        document = {
            "open_turns": [v.as_dict() for v in verdicts],
            "summary": summarize(verdicts),
            "read_model": caught.as_dict(),
        }
        typer.echo(json.dumps(document))
        raise typer.Exit(OPERATOR_MUST_ACT if _operator_must_act(verdicts) else 0)
    style = "" if caught.current else "[yellow]"
    out.print(f"{style}{escape(caught.describe())}", soft_wrap=True)
    table = id_table("session", "turn", "state", "decision", "detail", ids=2)
    for v in verdicts:
        table.add_row(v.session_id, v.turn_id, v.state, str(v.decision), escape(v.detail))
    print_table(table)
    out.print(summarize(verdicts))
    if apply:
        with refusals():
            runtime.executor.tools.load()  # turns may run tools: their MCP servers first
        _apply(runtime, verdicts)
    if _operator_must_act(verdicts):
        out.print("an operator must act: `turnlog sessions show ID` says what is unknown")
        raise typer.Exit(OPERATOR_MUST_ACT)


# The exit code of a 409 (conflict), as for a refused turn: the turn waits for a person.
OPERATOR_MUST_ACT = 3


def _operator_must_act(verdicts: list[Any]) -> bool:
    from turnlog.domain.progress import Decision

    waiting = {Decision.INTERRUPT, Decision.LEAVE_FOR_OPERATOR, Decision.LEAVE_FOR_APPROVAL}
    return any(v.decision in waiting for v in verdicts)


def _apply(runtime: Any, verdicts: list[Any]) -> None:
    from uuid import UUID

    for v in verdicts:
        if v.decision.startswith("leave"):
            continue
        done = runtime.drive(UUID(v.session_id))
        if done is None:
            out.print(f"{v.session_id}: owner came back; left alone")
            continue
        out.print(f"{v.session_id}: {done[0].decision if done else 'nothing open'}")


def workers(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Registered workers, newest first: pid, host, heartbeat age, turns held, stopped."""
    from turnlog.application.store.workers_registry import list_workers

    root: Any = ctx.find_root().obj
    with refusals():
        runtime = root.runtime()
        rows = list_workers(runtime.db, runtime.settings.namespace)
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = id_table("worker", "pid", "host", "heartbeat age (s)", "turns held", "stopped at")
    for w in rows:
        table.add_row(
            w["worker_id"],
            str(w["pid"]),
            escape(str(w["host"])),
            f"{w['heartbeat_age_seconds']:.1f}",
            f"{w['turns_held']}/{w['concurrency']}",
            w["stopped_at"] or "-",
        )
    print_table(table)
