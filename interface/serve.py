"""``turnlog serve``: the HTTP API, a worker and the projection runners in one process.

``--role`` splits them: ``api`` (HTTP only: records commands, serves reads),
``worker`` (executes turns), ``projections`` (keeps the read models), or
``all`` (the default). Every role answers ``/healthz``, ``/readyz`` and
``/metrics`` on its port; only ``api`` and ``all`` serve ``/v1``.

SIGTERM and SIGINT (Ctrl-C) alike are uvicorn's graceful shutdown: stop
accepting, let in-flight requests finish (waits and event streams end
early), then drain the worker for up to ``--drain-timeout`` seconds and stop
the runners. A turn still busy then (a long tool call) is left to recovery:
the process exits without waiting for it. A second signal exits at once.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket
import sys
from types import FrameType
from typing import Annotated, Any

import typer
import uvicorn

from turnlog.application.settings import Settings
from turnlog.interface.logs import configure_logging
from turnlog.interface.roles import Role

GRACEFUL_SECONDS = 30
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
) -> None:
    """Serve the HTTP API with a worker and the projection runners (see --role)."""
    settings: Settings = ctx.find_root().obj.settings()
    refusal = open_bind_refusal(host, settings) or busy_port_refusal(host, port)
    if refusal:
        typer.echo(f"error: {refusal}", err=True)
        raise typer.Exit(2)
    configure_logging(settings)
    # The CLI's other commands do not need FastAPI.
    from turnlog.interface.http import create_app
    from turnlog.interface.http.protocol import timed_protocol
    from turnlog.interface.http.state import Options

    options = Options(drain_timeout=drain_timeout)
    app = create_app(settings, role=role, worker_concurrency=concurrency, options=options)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
        server_header=False,
        # Slow clients: headers and bodies have deadlines (interface/http/protocol.py).
        http=timed_protocol(settings.header_timeout, settings.body_timeout),
    )
    server = _Server(config, app.state.turnlog.draining)
    # uvicorn raises a SIGINT it caught again once it has shut down; the stop
    # was orderly, so no traceback.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if server.signalled is not None:
        _exit_now(128 + server.signalled)
    if not server.started:
        raise typer.Exit(1)


def _exit_now(code: int) -> None:
    """Exit without waiting for a turn the drain left running (recovery takes it over).

    A tool call can run for minutes in a worker thread, and the interpreter
    joins such threads before it exits: after a drain that timed out, that
    wait is what SIGINT used to hang on. Logs and output are flushed first.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def open_bind_refusal(host: str, settings: Settings) -> str:
    """Why binding ``host`` is refused ('' when it is allowed)."""
    if _is_loopback(host) or settings.api_token is not None:
        return ""
    return (
        f"refusing to serve on {host} without an API token: anyone who can reach it could "
        "run agents and read every session. Set TURNLOG_API_TOKEN, or bind to 127.0.0.1."
    )


def busy_port_refusal(host: str, port: int) -> str:
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
                " `turnlog serve`?) may be using it: stop it, or choose another --port."
            )
    return ""


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: we cannot tell, so it counts as exposed


class _Server(uvicorn.Server):
    """Uvicorn's server, also telling the app that a shutdown began.

    Long waits (``?wait=``) and live event streams watch ``draining`` so they
    end promptly instead of holding the graceful shutdown to its timeout.
    """

    def __init__(self, config: uvicorn.Config, draining: Any) -> None:
        super().__init__(config)
        self._draining = draining
        self.signalled: int | None = None  # the first stop signal, if one came

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.signalled is not None:
            log.warning("second %s: exiting now; open turns are left to recovery", _name(sig))
            _exit_now(128 + sig)
        self.signalled = sig
        log.info("%s: stopping (a second one exits at once)", _name(sig))
        self._draining.set()
        super().handle_exit(sig, frame)


def _name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
