"""The database-crash run: ``python tests/fault/pg_crash.py --rounds 8`` (part of ``make chaos``).

One PostgreSQL server of its own, built in a temporary directory from the
machine's binaries (tests/fault/pg_pair.py's); ``turnlog serve`` on it; the
fake model of tests/fault/failover.py; the client threads of
tests/fault/campaign.py (plain turns, a read-only tool, the side-effecting
``append_file``, cancels, approvals, an operator settling what is
interrupted), each with an ``Idempotency-Key``, retrying through 503s.

Each round, at a random moment of the load, every process of the server is
SIGKILLed at once (the postmaster's process group: an immediate stop, no
shutdown checkpoint, its WAL buffers gone), and the same server is started
again on the same data directory (crash recovery). serve is not restarted:
its pools reconnect and its cached sessions meet the stored record again.
The server runs with ``fsync=off`` (a killed process's writes are in the
kernel's cache; the machine does not crash) and ``wal_writer_delay`` of
``--wal-writer-delay`` ms, so a commit that rode (docs/durability.md) stays
in the WAL buffers longer and a kill loses it more often than at the
default 200 ms.

At the end every invariant of tests/fault/record.py is checked on the whole
record (every acknowledged submission is there, every line a side-effecting
call wrote has its intent, every succeeded side-effecting outcome its line,
no stream has a gap, no interruption without an unknown outcome …), every
turn a client saw end still ends that way, every session's hash chain is
verified (``turnlog audit --verify``) and the read models are compared with
a rebuild (``turnlog projections verify``). One JSON line is printed (also in
``.turnlog/pg-crash.json``)::

    {"passed": true, "acknowledged": N, "lost": 0, "ends_changed": 0,
     "gaps_refused": G, "recovered_s": S, ...}

``gaps_refused``: saves serve's cached sessions tried over a commit the crash
lost ("version … is missing" in its log): each was refused, the session read
again. Exits 1 on any finding, too few turns or a round slower than
``--max-recovery`` to complete a turn after the kill.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from eventsourcing.persistence import StoredEvent  # noqa: E402
from psycopg import sql  # noqa: E402

from tests import deadlines  # noqa: E402
from tests.fault.campaign import PROBED, Client, Workload  # noqa: E402
from tests.fault.cluster import Process, free_port  # noqa: E402
from tests.fault.failover import (  # noqa: E402
    ToolModel,
    first_turn_after,
    new_session,
    say,
    served_cluster,
    start_serve,
    verified,
)
from tests.fault.pg_pair import Node, binaries, run_as  # noqa: E402
from tests.fault.record import Record, check  # noqa: E402
from tests.openai_stub import Answer, Received  # noqa: E402
from turnlog.application.store import logorder  # noqa: E402

GAP = re.compile(r"version \d+ is missing, so version \d+ was not stored")
RESTARTED = re.compile(r"the database restarted \(at ")
Row = tuple[UUID, int, str, bytes]  # a stored event: session, version, topic, state
END_EVENTS = {
    "TurnCompleted": "completed",
    "TurnFailed": "failed",
    "TurnCancelled": "cancelled",
    "TurnAbandoned": "abandoned",
}


class SlowModel(ToolModel):
    """The fake model, answering after ``latency`` seconds, as a real one takes its time.

    While a turn waits for it, the commits that rode before the call are not yet on
    disk unless another commit flushed them: the window a crash must hit to lose them.
    """

    def __init__(self, latency: float) -> None:
        super().__init__()
        self.latency = latency

    def _next(self, received: Received) -> Answer:
        time.sleep(self.latency)  # the model's own time to answer (not a wait for a condition)
        return super()._next(received)


class Server:
    """One PostgreSQL server in a temporary directory, crashed and started again at will."""

    def __init__(self, port: int, wal_writer_delay_ms: int, dbname: str = "turnlog") -> None:
        self.bin = binaries()
        self.user = run_as()
        self.root = Path(tempfile.mkdtemp(prefix="turnlog-pg-crash-"))
        self.dbname = dbname
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.node = Node(self, "node0", port)  # type: ignore[arg-type]
        self.wal_writer_delay_ms = wal_writer_delay_ms

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.node.port}/{self.dbname}"

    def start(self) -> Server:
        import subprocess

        subprocess.run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.node.data),
                "-U",
                "postgres",
                "-N",
                "--auth=trust",
            ],
            check=True,
            user=self.user,
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.node.port),
            "unix_socket_directories": f"'{self.root}'",
            "max_connections": "300",
            "synchronous_commit": "on",
            "fsync": "off",
            "full_page_writes": "off",
            "wal_writer_delay": f"{self.wal_writer_delay_ms}ms",
        }
        with (self.node.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        self.node.start()
        self.node.sql(f'CREATE DATABASE "{self.dbname}"')
        return self

    def crash(self) -> None:
        """SIGKILL every process of the server at once, and wait until none is left.

        Each child of the postmaster leads a process group of its own, so they
        are found by their parent and killed one by one, the postmaster first
        (no new child can start), in a few microseconds.
        """
        proc = self.node.proc
        assert proc is not None and proc.poll() is None
        children = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        for pid in children + _children(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()

        def gone() -> bool:
            return not any(_alive(pid) for pid in children)

        deadlines.poll(gone, 30, "every process of the killed server gone", every=0.02)

    def log_tail(self) -> str:
        path = self.root / f"{self.node.name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def close(self) -> None:
        self.node.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


@dataclass
class Watching(Workload):
    """The campaign's clients, also keeping how each turn they saw through ended."""

    ended: dict[str, str] = field(default_factory=dict)  # turn id → state seen last

    def _see_through(self, http: Client, session_id: str, turn_id: str, *args: Any) -> None:
        super()._see_through(http, session_id, turn_id, *args)
        state = http.call("GET", f"/v1/sessions/{session_id}/turns/{turn_id}", {200}).json()
        with self.lock:
            self.ended[turn_id] = str(state["state"])


class Crashes:
    """The server, serve on it, the workload; one round per crash."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.server = Server(free_port(), args.wal_writer_delay).start()
        self.model = SlowModel(args.model_latency).start()
        self.settings, self.cluster, self.port = served_cluster(self.server.url, "crash")
        self.database = self.cluster.database
        self.serve: Process | None = None
        self.workload = Watching(self.cluster, clients=args.clients)
        self.rounds: list[dict[str, Any]] = []
        self.chance = random.Random(args.seed)
        self.lost: list[Row] = []  # rows seen before a crash, gone after it
        self._table = sql.SQL(
            "SELECT originator_id, originator_version, topic, state FROM {}"
        ).format(logorder.table(self.settings.schema_name, "sessions_events"))

    def _rows(self) -> set[Row]:
        """Every stored event, read in one statement."""
        with psycopg.connect(self.server.url, autocommit=True) as conn:
            return {(r[0], int(r[1]), str(r[2]), bytes(r[3])) for r in conn.execute(self._table)}

    def lost_durable(self, record: Record) -> list[str]:
        """The rows a crash lost that were not allowed to ride (domain.durability)."""
        effects = {
            str(e.payload["call_id"]): str(e.payload.get("effect", ""))
            for e in record.events
            if e.topic == "ToolCallStarted"
        }
        wrong = []
        for row in self.lost:
            event: Any = record._app.mapper.to_domain_event(StoredEvent(*row))
            short = row[2].split(".")[2]
            if short == "TurnClaimed":
                continue
            if short == "ModelReplied" and event.tool_calls:
                continue
            if short in ("ToolCallSucceeded", "ToolCallFailed") and effects.get(event.call_id) in (
                "read_only",
                "idempotent",
            ):
                continue
            wrong.append(f"{row[0]} v{row[1]} {short}")
        return wrong

    def start(self) -> None:
        self.serve = start_serve(
            self.cluster, self.port, self.model.url, self.args.split, self.args
        )
        self.workload.start()

    def round(self, n: int) -> dict[str, Any]:
        before = len(self.workload.acknowledged)
        session = new_session(self.cluster.api_url)
        time.sleep(self.chance.uniform(0.5, self.args.load))  # the load runs meanwhile
        seen = self._rows()  # commits that rode are visible before they are on disk
        self.server.crash()
        killed = time.monotonic()
        try:
            self.server.node.start()
        except RuntimeError:
            say(f"the server did not start again:\n{self.server.log_tail()}")
            raise
        restarted = time.monotonic() - killed
        lost = seen - self._rows()
        self.lost.extend(sorted(lost))
        recovered = first_turn_after(self.cluster.api_url, session, killed, self.args.max_recovery)
        say(
            f"round {n}: server killed; up again in {restarted:.2f}s; a turn completed"
            f" {recovered:.1f}s after the kill"
        )
        result = {
            "round": n,
            "restart_s": round(restarted, 2),
            "recovered_s": round(recovered, 1),
            "acknowledged": len(self.workload.acknowledged) - before,
            "rows_lost": len(lost),
        }
        self.rounds.append(result)
        return result

    def finish(self) -> dict[str, Any]:
        self.workload.finish()
        record = Record(self.settings, self.database).refresh()
        findings = check(
            record,
            list(self.workload.acknowledged),
            None,
            markers=dict(self.workload.markers),
            probed=PROBED,
        )
        ends = {
            str(e.payload["turn_id"]): END_EVENTS[e.topic]
            for e in record.events
            if e.topic in END_EVENTS
        }
        changed = sorted(
            f"{turn_id}: seen {seen}, stored {ends.get(turn_id, 'no end')}"
            for turn_id, seen in self.workload.ended.items()
            if seen in END_EVENTS.values() and ends.get(turn_id) != seen
        )
        problems: dict[str, Any] = {k: v for k, v in vars(findings).items() if v}
        durable_lost = self.lost_durable(record)
        if durable_lost:
            problems["durable_rows_lost"] = durable_lost[:10]
        if changed:
            problems["ends_changed"] = changed[:10]
        verify = verified(self.cluster.api_url, self.settings, record)
        if verify:
            problems["verify"] = verify
        record.close()
        log = self.serve.output() if self.serve else ""
        return {
            "acknowledged": len(self.workload.acknowledged),
            "seen_ended": len(self.workload.ended),
            "lost": len(findings.lost),
            "ends_changed": len(changed),
            "rows_lost": len(self.lost),
            "rows_lost_by_topic": dict(Counter(r[2].split(".")[2] for r in self.lost)),
            "gaps_refused": len(GAP.findall(log)),
            "restarts_noticed": len(RESTARTED.findall(log)),
            "interrupted": sum(e.topic == "TurnInterrupted" for e in record.events),
            "operator": dict(self.workload.operator),
            "client_retries": self.workload.retries,
            "recovered_s": max((r["recovered_s"] for r in self.rounds), default=None),
            "rounds": self.rounds,
            "problems": problems,
            "workload_errors": self.workload.errors[:5],
        }

    def close(self) -> None:
        self.workload.stop.set()
        self.cluster.stop_all()
        self.model.stop()
        self.server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--load", type=float, default=4.0, help="longest load before a kill, s")
    parser.add_argument("--min-turns", type=int, default=60)
    parser.add_argument("--max-recovery", type=float, default=30.0)
    parser.add_argument("--wal-writer-delay", type=int, default=1000, help="ms")
    parser.add_argument("--model-latency", type=float, default=0.1, help="s per model answer")
    parser.add_argument("--split", action="store_true", help="serve --split")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, default=ROOT / ".turnlog" / "pg-crash.json")
    args = parser.parse_args()
    started = time.monotonic()
    run = Crashes(args)
    say(f"server in {run.server.root}; turnlog logs in {run.settings.data_dir}; {run.server.url}")
    try:
        run.start()
        for n in range(1, args.rounds + 1):
            run.round(n)
        figures = run.finish()
    finally:
        run.close()
    figures["seconds"] = round(time.monotonic() - started)
    ok = (
        not figures["problems"]
        and not figures["workload_errors"]
        and figures["acknowledged"] >= args.min_turns
        and all(r["recovered_s"] <= args.max_recovery for r in figures["rounds"])
    )
    figures["passed"] = ok
    if ok:  # the logs of a failed run are kept for a look
        shutil.rmtree(run.settings.data_dir, ignore_errors=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
