"""``turnlog serve``: the HTTP API, a worker and the projection runners in one process.

``--role`` splits them: ``api`` (HTTP only: records commands, serves reads),
``worker`` (executes turns), ``projections`` (keeps the read models), or
``all`` (the default). Every role answers ``/healthz``, ``/readyz`` and
``/metrics`` on its port; only ``api`` and ``all`` serve ``/v1``.

``--split`` (with ``all``) runs the worker and the projection runners as
child processes, so serve uses up to three cores instead of one
(``interface.children``).

SIGTERM and SIGINT (Ctrl-C) alike are uvicorn's graceful shutdown: stop
accepting, let in-flight requests finish (waits and event streams end
early), then drain the worker for up to ``--drain-timeout`` seconds and stop
the runners. A turn still busy then (a long tool call) is left to recovery:
the process exits without waiting for it. A second signal exits at once.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from turnlog.application.settings import Settings
from turnlog.interface.bootstrap import tune_collector
from turnlog.interface.logs import configure_logging
from turnlog.interface.roles import Role
from turnlog.interface.terminal import refusals

if TYPE_CHECKING:
    from turnlog.interface.children import Children

log = logging.getLogger("turnlog.serve")


def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to bind; non-loopback needs a token.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to bind.")] = 8000,
    role: Annotated[Role, typer.Option(help="What this process runs.")] = Role.ALL,
    concurrency: Annotated[
        int, typer.Option(min=1, max=256, help="Turns one worker runs at once.")
    ] = 4,
    drain_timeout: Annotated[
        float,
        typer.Option(min=0, help="On SIGTERM or SIGINT, seconds to finish the current steps."),
    ] = 30.0,
    split: Annotated[
        bool,
        typer.Option(
            "--split",
            help="With --role all: run the worker and the projection runners as child"
            " processes (up to three cores instead of one; Linux).",
        ),
    ] = False,
    children_metrics_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65534,
            help="With --split: the worker child serves /metrics on this port, the"
            " projections child on the next one, on --host (0: off).",
        ),
    ] = 0,
) -> None:
    """Serve the HTTP API with a worker and the projection runners (see --role)."""
    settings: Settings = ctx.find_root().obj.settings()
    refusal = (
        split_refusal(split, role, children_metrics_port)
        or open_bind_refusal(host, settings)
        or busy_port_refusal(host, port)
        or _children_ports_refusal(host, children_metrics_port)
    )
    if refusal:
        typer.echo(f"error: {refusal}", err=True)
        raise typer.Exit(2)
    configure_logging(settings)
    # The CLI's other commands need neither FastAPI nor uvicorn.
    from turnlog.interface.http import create_app
    from turnlog.interface.http.server import draining_server, exit_now
    from turnlog.interface.http.state import Options

    options = Options(drain_timeout=drain_timeout)
    here = Role.API if split else role
    with refusals():  # a bad tenants file is refused here, naming its entry
        app = create_app(settings, role=here, worker_concurrency=concurrency, options=options)
    server = draining_server(app, settings, host, port)
    server.on_listening = functools.partial(_say_where, here)
    tune_collector()
    children = None
    if split:
        commands = (concurrency, drain_timeout, children_metrics_port, host)
        children = _start_children(settings, commands, server.stop)
        server.after_shutdown = functools.partial(children.stop, drain_timeout)
    try:
        # uvicorn raises a SIGINT it caught again once it has shut down; the stop
        # was orderly, so no traceback.
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
    finally:
        if children is not None:
            children.stop(drain_timeout)
    if children is not None and children.failed is not None:
        raise typer.Exit(1)
    if server.signalled is not None:
        exit_now(128 + server.signalled)
    if not server.started:
        raise typer.Exit(1)


def _say_where(role: Role, host: str, port: int) -> None:
    """Where to point a client, a browser and the API's docs, once the port is bound."""
    name = f"[{host}]" if ":" in host else host
    base = f"http://{name}:{port}"
    # Logged, not printed: a line of JSON logs stays JSON.
    if role.serves_api:
        log.info("API %s/v1  docs %s/docs  console %s/console", base, base, base)
    else:
        log.info("%s process; metrics %s/metrics", role, base)


def split_refusal(split: bool, role: Role, children_metrics_port: int) -> str:
    """Why ``--split`` (and its options) is refused here ('' when it is allowed)."""
    from turnlog.interface.children import unsupported_reason

    if not split:
        return "--children-metrics-port needs --split" if children_metrics_port else ""
    if role is not Role.ALL:
        return f"--split splits --role all into three processes; --role {role} is one of them"
    return unsupported_reason()


def _children_ports_refusal(host: str, port: int) -> str:
    """Why the children's metrics ports cannot be used ('' when they can, or are not asked for)."""
    if not port:
        return ""
    flag = "--children-metrics-port"
    return busy_port_refusal(host, port, flag) or busy_port_refusal(host, port + 1, flag)


def _start_children(
    settings: Settings, options: tuple[int, float, int, str], on_exit: Callable[[], None]
) -> Children:
    """The worker and the projections runner, once the database is there for them.

    ``options``: serve's concurrency, drain timeout, children's metrics port and host.
    """
    from turnlog.application.store.database import locate
    from turnlog.interface.children import Children, child_env, role_commands

    with refusals():
        locate(settings)  # starts an embedded server once, before two children look for it
    return Children.start(role_commands(*options), child_env(settings, os.environ), on_exit)


def open_bind_refusal(host: str, settings: Settings) -> str:
    """Why binding ``host`` is refused ('' when it is allowed)."""
    if _is_loopback(host) or settings.api_token is not None or settings.tenants_file is not None:
        return ""
    return (
        f"refusing to serve on {host} without an API token: anyone who can reach it could "
        "run agents and read every session. Set TURNLOG_API_TOKEN (or TURNLOG_TENANTS_FILE),"
        " or bind to 127.0.0.1."
    )


def busy_port_refusal(host: str, port: int, flag: str = "--port") -> str:
    """Why ``host:port`` cannot be served ('' when it is free), found before anything starts.

    Without this check the process would prepare the namespace and start its
    worker and runners, only for uvicorn to fail to bind afterwards.
    """
    if port == 0:
        return ""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            return (
                f"cannot listen on {host}:{port}: {exc.strerror or exc}. Another process (another"
                f" `turnlog serve`?) may be using it: stop it, or choose another {flag}."
            )
    return ""


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: we cannot tell, so it counts as exposed
