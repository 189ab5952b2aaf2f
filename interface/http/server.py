"""Uvicorn, run for ``turnlog serve``: its config and a server that tells the app of a stop.

Imported only by the ``serve`` command, so the CLI's other commands never load uvicorn.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from turnlog.application.settings import Settings
from turnlog.interface.http.protocol import timed_protocol
from turnlog.interface.terminal import signal_name

GRACEFUL_SECONDS = 30
log = logging.getLogger("turnlog.serve")


def draining_server(app: FastAPI, settings: Settings, host: str, port: int) -> DrainingServer:
    """A server for ``app`` on ``host:port``, ready to ``run()``."""
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
    return DrainingServer(config, app.state.turnlog.draining)


class DrainingServer(uvicorn.Server):
    """Uvicorn's server, also telling the app that a shutdown began.

    Long waits (``?wait=``) and live event streams watch ``draining`` so they
    end promptly instead of holding the graceful shutdown to its timeout.
    """

    def __init__(self, config: uvicorn.Config, draining: Any) -> None:
        super().__init__(config)
        self._draining = draining
        self.signalled: int | None = None  # the first stop signal, if one came
        # Runs (in a thread) once the API has shut down, before uvicorn re-raises
        # the stop signal, which ends the process.
        self.after_shutdown: Callable[[], None] | None = None
        # Told the address the API listens on, once it does (its port, if 0 was asked).
        self.on_listening: Callable[[str, int], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.on_listening is not None and self.started:
            for server in self.servers:
                for bound in server.sockets:
                    host, port = bound.getsockname()[:2]
                    self.on_listening(str(host), int(port))
                    return

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.after_shutdown is not None:
            await asyncio.to_thread(self.after_shutdown)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.signalled is not None:
            log.warning("second %s: exiting now; open turns are left to recovery", signal_name(sig))
            exit_now(128 + sig)
        self.signalled = sig
        log.info("%s: stopping (a second one exits at once)", signal_name(sig))
        self._draining.set()
        super().handle_exit(sig, frame)

    def stop(self) -> None:
        """Stop as on a signal, from any thread, without a signal (a child of serve died)."""
        self._draining.set()
        self.should_exit = True


def exit_now(code: int) -> None:
    """Exit without waiting for a turn the drain left running (recovery takes it over).

    A tool call can run for minutes in a worker thread, and the interpreter
    joins such threads before it exits: after a drain that timed out, that
    wait is what SIGINT used to hang on. Logs and output are flushed first.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
