"""A TCP proxy in front of the test's PostgreSQL that a test can take down and bring back.

Taking it down closes the listening socket and every connection through it,
which is what a client sees of a server that stops: without restarting the
server every other test shares.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from tests.fault.cluster import free_port


class Proxy:
    """Forwards 127.0.0.1:``port`` to the server in ``params`` (TCP or a unix socket)."""

    def __init__(self, params: dict[str, Any]) -> None:
        host = str(params.get("host") or "localhost")
        port = int(params.get("port") or 5432)
        if host.startswith("/"):
            self._target: Any = f"{host}/.s.PGSQL.{port}"
            self._family = socket.AF_UNIX
        else:
            self._target, self._family = (host, port), socket.AF_INET
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._severed: set[socket.socket] = set()
        self._lock = threading.Lock()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and cut every open one."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        for s in [listener, *sockets]:
            if s is not None:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def sever(self) -> None:
        """Make every open connection fail at its next use, with no sign of it before.

        What a client sees of a backend told to end that has not yet said so:
        the connection looks idle and healthy until something is sent on it;
        then it is cut. New connections are forwarded as usual.
        """
        with self._lock:
            self._severed |= self._sockets

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # taken down
            try:
                server = socket.socket(self._family)
                server.connect(self._target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._sockets |= {client, server}
            pair: dict[str, threading.Event] = {}  # what the two pumps of one connection share
            for a, b, up in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(a, b, up, pair), daemon=True).start()

    def lose_at(self, marker: bytes, *, answered: bool) -> threading.Event:
        """Once: cut the connection that next sends ``marker`` to the server; set when done.

        ``answered``: the server gets the message and its answer is lost (the
        connection is cut when the answer comes); otherwise the message is
        lost before the server gets it. Either way the client only sees its
        connection end: a commit whose outcome it cannot know.
        """
        done = threading.Event()
        with self._lock:
            self._trap = (marker, answered, done)
        return done

    _trap: tuple[bytes, bool, threading.Event] | None = None

    def _sprung(self, data: bytes) -> tuple[bool, threading.Event] | None:
        with self._lock:
            trap = self._trap
            if trap is None or trap[0] not in data:
                return None
            self._trap = None
        return trap[1], trap[2]

    def _pump(
        self, source: socket.socket, sink: socket.socket, up: bool, pair: dict[str, Any]
    ) -> None:
        try:
            while data := source.recv(65536):
                if source in self._severed:
                    break  # cut at its first use, both ways (the finally below)
                if not up and "swallow" in pair:
                    pair["swallow"].set()  # the answer arrived: lost with the connection
                    return
                sprung = self._sprung(data) if up else None
                if sprung is not None:
                    answered, done = sprung
                    if not answered:
                        done.set()
                        return
                    pair["swallow"] = done
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
