"""``turnlog worker`` and ``turnlog check``: executing turns, and the restart check."""

from __future__ import annotations

import logging
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from turnlog.application.worker import check_open_turns
from turnlog.interface.metrics import MetricsServer
from turnlog.interface.roles import OpenTurnsSource, Parts, Role
from turnlog.interface.terminal import stop_on_signals

out = Console(highlight=False, soft_wrap=True)
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

    settings = ctx.find_root().obj.settings()
    configure_logging(settings)
    parts = Parts(settings, Role.WORKER, worker_concurrency=concurrency)
    metrics = MetricsServer(parts)
    parts.observer = metrics.execution
    if metrics_port:  # before the database: a busy port fails fast
        metrics.start_or_exit(metrics_host, metrics_port)
    stop = stop_on_signals()
    parts.start()  # logs "worker … started: <start-up check>"
    assert parts.worker is not None
    stop.wait()
    log.info("draining (up to %gs)…", drain_timeout)
    held = parts.worker.held
    parts.stop(drain_timeout=drain_timeout)
    metrics.stop()
    log.info("worker stopped (%d turn(s) were held)", held)


def check(
    ctx: typer.Context,
    apply: Annotated[bool, typer.Option("--apply", help="Act on the decisions now.")] = False,
) -> None:
    """The restart check: every open turn and what recovery does with it."""
    from turnlog.projections.queries import ReadModels

    root: Any = ctx.find_root().obj
    runtime = root.runtime()
    read_models = ReadModels(runtime.db, runtime.settings, sessions=runtime.sessions)
    verdicts = check_open_turns(runtime, OpenTurnsSource(read_models))
    table = Table("session", "turn", "state", "decision", "detail")
    for v in verdicts:
        table.add_row(v.session_id, v.turn_id, v.state, str(v.decision), v.detail)
    out.print(table)
    from turnlog.application.recovery import summarize

    out.print(summarize(verdicts))
    if not apply:
        return
    from uuid import UUID

    from turnlog.application.leases import Lease

    for v in verdicts:
        if v.decision.startswith("leave"):
            continue
        lease = Lease.try_acquire(runtime.db, runtime.settings.namespace, UUID(v.session_id))
        if lease is None:
            out.print(f"{v.session_id}: owner came back; left alone")
            continue
        with lease:
            done = runtime.recover(UUID(v.session_id), lease)
        out.print(f"{v.session_id}: {done.decision if done else 'nothing open'}")
