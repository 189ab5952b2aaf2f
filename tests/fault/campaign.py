"""The kill campaign: clients submit turns while random processes are SIGKILLed.

An API, a projection runner and workers run as separate processes
(``cluster.Cluster``). Client threads submit a mix of turns — plain, a
``read_only`` tool (in turns, the built-in ``sleep`` and ``nap``, a command tool that
runs in the OS sandbox), a ``side_effecting`` tool with a delay — each to its own
session, with an ``Idempotency-Key`` per turn, retrying through the API's
deaths, so an acknowledged turn is never submitted twice. A killer picks a
process at random (API, projections or a worker), SIGKILLs it at a random
moment, starts a replacement, and checks the round: the role serves again,
every turn the dead worker held was resumed (nothing unsafe in flight) or
interrupted (its side-effecting call's outcome unknown), and the invariants
of ``record.check`` hold. An interrupted turn is settled as an operator would:
the client looks for the call's marker line and resolves the call with what
it found, or abandons the turn.

Operators act on running work too: every third client's session asks for
approval before side-effecting calls (``approval_policy``), and the client
approves or rejects each proposed call at random; about one turn in
``CANCEL_ONE_IN`` is cancelled at a random moment. Each cancel and decision
the API acknowledged must be in the session's record at the end.

With ``probes`` every process runs with outcome probes on (``TURNLOG_PROBES``):
a worker killed inside ``append_file`` leaves a call that recovery settles by
asking the tool's probe (``application/execution/settling.py``) instead of interrupting
the turn. Random kills land mostly before the write (the call's delay), so
one worker kill in ``AIM_ONE_IN`` is aimed after it: with inserts into the
log held back (a table lock, as the restart demo does), the killer waits
until a call of the victim has written its line, kills the victim, ends the
victim's database sessions still waiting to insert, and lets go — the line
is written, its result never recorded, and the probe must answer
``applied``.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

from tests import deadlines
from tests.conftest import turnlog
from tests.deadlines import scaled
from tests.fault.cluster import Cluster, Process, poll, worker_pid
from tests.fault.record import (
    EFFECTS_FILE,
    ENDINGS,
    PROBE_ACTOR,
    SETTLED,
    Kill,
    Record,
    Stored,
    call_names,
    check,
    final_state,
    held_at,
    marker_written,
    percentile,
    recovered,
    takeover_latencies,
)
from turnlog.projections.catalog import read_models
from turnlog.projections.status import lock_holder

FINISHED = {"completed", "failed", "interrupted", "abandoned", "cancelled"}
RETRYABLE = {502, 503, 504}
CANCEL_ONE_IN = 6  # about one turn in this many is cancelled by the client
APPROVING_CLIENT = 3  # every third client's session asks approval of side-effecting calls
AIM_ONE_IN = 3  # with probes on, one worker kill in this many is aimed after a write
PROBED = frozenset({"append_file"})  # the tools whose probe recovery asks (probes on)
# A read-only command tool: its process runs in the sandbox (TURNLOG_SANDBOX is on).
NAP_TOOLS = """
[[tools]]
name = "nap"
description = "Sleep a little in the sandbox."
command = ["sleep", "0.4"]
effect = "read_only"
parameters = { type = "object", properties = {} }
"""


def message_for(i: int) -> tuple[str, str, str]:
    """(kind, message, marker) of the i-th turn: plain, read_only or side_effecting."""
    kind = ("plain", "read_only", "side_effecting")[i % 3]
    if kind == "plain":
        return kind, f"hello {i}", ""
    if kind == "read_only":
        if i % 2:
            return kind, "/tool nap {}", ""  # a sandboxed process (bwrap), killed with its worker
        return kind, '/tool sleep {"seconds": 0.4}', ""
    marker = f"turn-{i}-{uuid.uuid4().hex[:8]}"
    body = {"path": EFFECTS_FILE, "text": marker, "delay_seconds": 0.6}
    return kind, f"/tool append_file {json.dumps(body)}", marker


def fixed(base: float) -> float:
    return base


class Client:
    """HTTP calls that ride out the API's deaths: retried until a deadline.

    The deadline is ``deadline(90)`` seconds stretched by the machine's load:
    the campaign makes it grow with the slowest restart it has measured.
    """

    def __init__(self, url: str, deadline: Callable[[float], float] = fixed) -> None:
        self.url = url
        self.deadline = deadline
        self.retries = 0

    def call(self, method: str, path: str, ok: set[int], **kwargs: Any) -> httpx.Response:
        start = time.monotonic()
        while True:
            try:
                response = httpx.request(method, self.url + path, timeout=15, **kwargs)
                if response.status_code in ok:
                    return response
                if response.status_code not in RETRYABLE:
                    raise AssertionError(f"{method} {path}: {response.status_code} {response.text}")
            except httpx.TransportError:
                pass  # the API died under us, or is restarting: the same request again
            waited = time.monotonic() - start
            if waited > scaled(self.deadline(90)):
                raise AssertionError(f"{method} {path}: no answer within {waited:.0f}s")
            self.retries += 1
            time.sleep(0.1)


@dataclass
class Workload:
    """Client threads, each with its own session, submitting until told to stop."""

    c: Cluster
    clients: int = 6
    deadline: Callable[[float], float] = fixed  # a base deadline → the one to use
    acknowledged: dict[str, str] = field(default_factory=dict)  # turn id → kind
    markers: dict[str, str] = field(default_factory=dict)  # marker → turn id
    operator: dict[str, int] = field(default_factory=lambda: {"resolved": 0, "abandoned": 0})
    # What the clients asked of running work, each acknowledged (200) or too late (409):
    # turn id → (session id, reason, answer); call id → (session id, turn id, decision, answer).
    cancels: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    decisions: dict[str, tuple[str, str, str, int]] = field(default_factory=dict)
    retries: int = 0  # requests repeated because the API was down or restarting
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _counter: int = 0
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for n in range(self.clients):
            thread = threading.Thread(target=self._guarded, args=(n,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def finish(self) -> None:
        """Stop submitting; wait for every client to see its last turn through."""
        self.stop.set()
        end = time.monotonic() + scaled(self.deadline(120)) + scaled(self.deadline(90))
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        if any(thread.is_alive() for thread in self._threads):
            self.errors.append("a client did not finish its last turn in time")

    def _guarded(self, n: int) -> None:
        http = Client(self.c.api_url, self.deadline)
        try:
            self._client(n, http)
        except Exception as exc:  # reported, and fails the run
            self.errors.append(f"client {n}: {exc}")
        finally:
            with self.lock:
                self.retries += http.retries

    def _next(self) -> int:
        with self.lock:
            self._counter += 1
            return self._counter

    def _client(self, n: int, http: Client) -> None:
        key = f"client-{n}-{uuid.uuid4().hex[:6]}"
        body: dict[str, Any] = {"title": key}
        if n % APPROVING_CLIENT == APPROVING_CLIENT - 1:
            body["approval_policy"] = "side_effecting"
        created = http.call(
            "POST", "/v1/sessions", {201}, json=body, headers={"Idempotency-Key": key}
        )
        session_id = created.json()["session_id"]
        chance = random.Random(f"{key}")
        while not self.stop.is_set():
            i = self._next()
            kind, message, marker = message_for(i)
            submitted = http.call(
                "POST",
                f"/v1/sessions/{session_id}/turns",
                {200, 202},
                json={"message": message},
                headers={"Idempotency-Key": f"{key}-turn-{i}"},
            )
            turn_id = submitted.json()["turn_id"]
            with self.lock:
                self.acknowledged[turn_id] = kind
                if marker:
                    self.markers[marker] = turn_id
            cancel_at = (
                time.monotonic() + chance.uniform(0.0, 0.4)
                if chance.randrange(CANCEL_ONE_IN) == 0
                else None
            )
            self._see_through(http, session_id, turn_id, marker, i, cancel_at, chance)

    def _see_through(
        self,
        http: Client,
        session_id: str,
        turn_id: str,
        marker: str,
        i: int,
        cancel_at: float | None = None,
        chance: random.Random | None = None,
    ) -> None:
        """Wait for the turn to finish; settle it as an operator would if interrupted,
        decide its proposed calls, and cancel it at ``cancel_at`` if given."""
        path = f"/v1/sessions/{session_id}/turns/{turn_id}"
        chance = chance or random.Random(turn_id)
        settled: set[tuple[str, ...]] = set()  # the unknown calls already settled

        def finished() -> bool:
            nonlocal cancel_at
            turn = http.call("GET", path, {200}).json()
            if cancel_at is not None and time.monotonic() >= cancel_at:
                cancel_at = None
                self._cancel(http, session_id, turn_id, i)
            if turn["state"] == "interrupted":
                # Settled once; then wait for what follows: abandoned, or (resolved) the
                # turn run on by a worker — a next turn submitted before it ends is a 409.
                unknown = tuple(sorted(turn["unknown_call_ids"]))
                if unknown not in settled:
                    settled.add(unknown)
                    self._settle(http, session_id, turn, marker, i)
                return False
            if turn["state"] == "awaiting_approval":
                for call in turn["tool_calls"]:
                    if call["state"] == "proposed":
                        self._decide(http, session_id, turn_id, call["call_id"], chance)
            return turn["state"] in FINISHED

        deadlines.poll(finished, self.deadline(120), f"turn {turn_id} finished", every=0.1)

    def _cancel(self, http: Client, session_id: str, turn_id: str, i: int) -> None:
        reason = f"chaos: cancel {i}"
        answer = http.call(
            "POST",
            f"/v1/sessions/{session_id}/turns/{turn_id}/cancel",
            {200, 409},  # 409: finished or interrupted first, or our earlier attempt did it
            json={"reason": reason, "actor": "chaos"},
        )
        with self.lock:
            if self.cancels.get(turn_id, ("", "", 409))[2] != 200:
                self.cancels[turn_id] = (session_id, reason, answer.status_code)

    def _decide(
        self, http: Client, session_id: str, turn_id: str, call_id: str, chance: random.Random
    ) -> None:
        with self.lock:
            known = self.decisions.get(call_id)
        decision = known[2] if known else chance.choice(("approved", "rejected"))
        body = {"actor": "chaos"} if decision == "approved" else {"actor": "chaos", "reason": "no"}
        verb = "approve" if decision == "approved" else "reject"
        answer = http.call(
            "POST",
            f"/v1/sessions/{session_id}/tool-calls/{call_id}/{verb}",
            {200, 409},  # 409: our earlier attempt did it before the API died, or a cancel won
            json=body,
        )
        with self.lock:
            if not known or known[3] != 200:
                self.decisions[call_id] = (session_id, turn_id, decision, answer.status_code)

    def _settle(
        self, http: Client, session_id: str, turn: dict[str, Any], marker: str, i: int
    ) -> None:
        if i % 2:
            http.call(
                "POST",
                f"/v1/sessions/{session_id}/turns/{turn['turn_id']}/abandon",
                {200, 409},  # 409: our earlier attempt did it before the API died
                json={"reason": "chaos: outcome unknown", "actor": "chaos"},
            )
            with self.lock:
                self.operator["abandoned"] += 1
            return
        written = marker_written(self.c.settings.sandbox_root, session_id, marker)
        for call_id in turn["unknown_call_ids"]:
            http.call(
                "POST",
                f"/v1/sessions/{session_id}/tool-calls/{call_id}/resolve",
                {200, 409},
                json={
                    "outcome": "succeeded" if written else "failed",
                    "result": {"marker_found": written},
                    "note": "checked the sandbox file",
                    "actor": "chaos",
                },
            )
        with self.lock:
            self.operator["resolved"] += 1


def _over(events: list[Stored], started: Stored, call_id: str) -> bool:
    """Whether the call has an outcome on record, or its turn ended, after ``started``."""
    return any(
        e.version > started.version
        and (e.topic in ENDINGS or (e.topic in SETTLED and str(e.payload["call_id"]) == call_id))
        for e in events
    )


def client_ports(pid: int) -> set[int]:
    """The local TCP ports of process ``pid``'s sockets (its database connections among them)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:[") : -1])
    except OSError:
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def end_backends(conninfo: str, ports: set[int]) -> int:
    """End the server sessions whose client used one of ``ports``; how many there were.

    Waits (up to 5 s each) until each is gone: an insert a killed process had
    sent, waiting on a lock, must not commit once the lock is let go.
    """
    if not ports:
        return 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE client_port = ANY(%s) AND pid <> pg_backend_pid()",
            (sorted(ports),),
        ).fetchall()
    return len(rows)


@dataclass
class Round:
    kill: Kill
    outcome: dict[str, str]  # held turn → resumed | interrupted
    problems: list[str]


class Campaign:
    """Kills processes of a running cluster, one round at a time, and checks each round.

    No wait has a fixed budget: each is the larger of its base and a multiple
    of the slowest restart measured so far in this run (``deadline``), and
    then stretched by the machine's load (tests/deadlines.py) — so a machine
    on which a restart takes 50 s instead of 2 s gives every wait room in
    proportion, while a hung process still fails the run.
    """

    def __init__(
        self,
        c: Cluster,
        workers: int = 2,
        seed: int = 8,
        pause: tuple[float, float] = (0.3, 2.0),
        say: Callable[[str], None] = lambda line: None,
        probes: bool = False,
    ) -> None:
        self.c = c
        self.say = say
        self.probes = probes
        # For every process started: probes are on by default, off here unless asked.
        tools = Path(c.settings.data_dir) / "campaign-tools.toml"
        tools.parent.mkdir(parents=True, exist_ok=True)
        tools.write_text(NAP_TOOLS)
        self.env = {"TURNLOG_PROBES": "1" if probes else "off", "TURNLOG_TOOLS_FILE": str(tools)}
        self.probed = PROBED if probes else frozenset()
        self.aimed: list[str] = []  # how each kill aimed after a write went: hit | missed: …
        self.loads: list[float] = []  # the 1-minute load average at each kill
        self.rng = random.Random(seed)
        self.pause = pause
        self.port = 0
        self.procs: dict[str, Process] = {}
        self.worker_names = [f"worker{i}" for i in range(workers)]
        self.kills: list[Kill] = []
        self.rounds: list[Round] = []
        self.unrecorded: list[str] = []  # operator actions acknowledged but not on record
        self.record = Record(c.settings, c.database)
        self.workload = Workload(c, deadline=self.deadline)

    def deadline(self, base: float) -> float:
        """``base`` seconds, or more where restarts in this run have been slow.

        A wait may span a restart and the next kill's restart, plus the
        recovery after it: four times the slowest restart measured covers that.
        """
        slowest = max((k.restored_after or 0.0 for k in self.kills), default=0.0)
        return max(base, 4 * slowest)

    # ------------------------------------------------------------ processes

    def start(self) -> None:
        self.procs["api"] = self.c.api("api", 0, **self.env)
        self.port = int(self.c.api_url.rsplit(":", 1)[1])
        self.procs["projections"] = self.c.projections(**self.env)
        for name in self.worker_names:
            self.procs[name] = self.c.worker(name, "--concurrency", "4", **self.env)
        self.workload.start()

    def _restart(self, name: str) -> Process:
        if name == "api":
            return self.c.start(f"api-{len(self.kills)}", *self._api_args(), **self.env)
        if name == "projections":
            return self.c.projections(**self.env)
        worker = f"{name}-{len(self.kills)}"
        return self.c.start(worker, "worker", "--concurrency", "4", **self.env)

    def _api_args(self) -> list[str]:
        return ["serve", "--port", str(self.port), "--role", "api"]

    def _restored(self, name: str, process: Process) -> bool:
        if process.proc.poll() is not None:
            raise AssertionError(f"{process.name} exited:\n{process.output()[-3000:]}")
        if name == "api":
            try:
                return httpx.get(f"{self.c.api_url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        if name == "projections":
            return self._runs_projections(process.pid)
        return self.c.worker_registered(process)

    def _runs_projections(self, pid: int) -> bool:
        ns = self.c.settings.namespace
        with psycopg.connect(self.c.database.conninfo, autocommit=True) as conn:
            holders = [lock_holder(conn, ns, m.name) for m in read_models()]
        return all(h is not None and h.endswith(f":{pid}") for h in holders)

    # --------------------------------------------------------------- rounds

    def plan(self, kills: int) -> list[str]:
        """Who dies in each round: at random, with every role at least once."""
        names = ["api", "projections", *self.worker_names]
        victims = [self.rng.choice(names) for _ in range(kills)]
        every_role = ["api", "projections", self.rng.choice(self.worker_names)]
        if kills >= len(every_role):
            for slot, name in zip(self.rng.sample(range(kills), 3), every_role, strict=True):
                victims[slot] = name
        return victims

    def run(self, kills: int) -> None:
        for name in self.plan(kills):
            time.sleep(self.rng.uniform(*self.pause))
            self.round(name)
            if self.workload.errors:
                raise AssertionError("; ".join(self.workload.errors))

    def round(self, name: str) -> None:
        role = "worker" if name.startswith("worker") else name
        victim = self.procs[name]
        worker_kills = sum(k.role == "worker" for k in self.kills)
        aimed = role == "worker" and self.probes and worker_kills % AIM_ONE_IN == AIM_ONE_IN - 1
        if aimed:
            how, died = self._kill_after_a_write(victim)
            self.aimed.append(how)
        else:
            victim.kill()  # returns once the process is gone
            # Taken after the death: every event the victim wrote is stamped before it.
            died = time.time()
        kill = Kill(died, role, victim.pid)
        self.kills.append(kill)
        self.loads.append(os.getloadavg()[0])
        replacement = self._restart(name)
        self.procs[name] = replacement
        poll(lambda: self._restored(name, replacement), self.deadline(60), f"{name} restored")
        kill.restored_after = time.time() - kill.at
        checked = self._check_round(kill)
        self.rounds.append(checked)
        self.say(
            f"kill {len(self.kills)}: {name} pid {kill.pid}, restored in"
            f" {kill.restored_after:.1f}s, checked after {time.time() - kill.at:.1f}s;"
            f" held turns: {sorted(checked.outcome.values()) or 'none'}"
            + (f"; aimed after a write: {self.aimed[-1]}" if aimed else "")
            + (f"; PROBLEMS: {checked.problems}" if checked.problems else "")
        )

    def _check_round(self, kill: Kill) -> Round:
        held = held_at(self.record.refresh(), kill.pid, kill.at) if kill.role == "worker" else {}

        def settled() -> dict[str, str] | None:
            outcome = recovered(self.record.refresh(), held, kill.at, self.probed)
            return outcome if all(outcome.values()) else None

        try:
            recovery = "recovery of the dead worker's turns"
            outcome = poll(settled, self.deadline(60), recovery) if held else {}
        except AssertionError as exc:
            outcome = recovered(self.record, held, kill.at, self.probed)
            return Round(kill, outcome, [str(exc)])
        problems = [f"{t}: {o}" for t, o in outcome.items() if o.startswith("WRONG")]
        # Acknowledged before the record is read: a turn acknowledged later may be newer.
        acknowledged = self._acknowledged()
        findings = check(
            self.record.refresh(), acknowledged, self._killed_workers(), probed=self.probed
        )
        problems += [f"{k}: {v}" for k, v in vars(findings).items() if v]
        return Round(kill, outcome, problems)

    # ------------------------------------------------- a kill aimed after a write

    def _kill_after_a_write(self, victim: Process) -> tuple[str, float]:
        """SIGKILL ``victim`` after a side-effecting call of its wrote its line and before
        the call's result is stored: 'hit', or why the kill missed that window; and the
        time of the death (taken at once: a recovering worker's events, written while
        the log is still held, are stamped after it).

        Inserts into the namespace's log are held back (``LOCK TABLE … IN
        EXCLUSIVE MODE``; reads go on) from before the line is written until
        the victim is dead and its database sessions still waiting to insert
        are ended; the other processes' inserts wait meanwhile, and go on.
        """
        table = sql.Identifier(self.c.settings.schema_name, "sessions_events")
        try:
            call = poll(
                lambda: self._write_ahead(victim.pid), self.deadline(20), "a write in flight"
            )
        except AssertionError:
            victim.kill()
            return "missed: no side-effecting call of the victim in flight", time.time()
        with psycopg.connect(self.c.database.conninfo) as conn:
            conn.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(table))
            session_id, _, marker = call
            root = self.c.settings.sandbox_root
            if self._write_ahead(victim.pid) != call:
                hit = "missed: the call ended before the log was held"
            else:
                try:
                    deadlines.poll(
                        lambda: marker_written(root, session_id, marker),
                        self.deadline(20),
                        "the line written",
                        every=0.002,
                    )
                    hit = "hit"
                except AssertionError:
                    hit = "missed: the line was not written in time"
            ports = client_ports(victim.pid)
            victim.kill()
            died = time.time()
            end_backends(self.c.database.conninfo, ports)
            conn.rollback()  # inserts go on
        return hit if ports else f"{hit} (its database sessions not found: none ended)", died

    def _write_ahead(self, pid: int) -> tuple[str, str, str] | None:
        """(session id, call id, marker) of an ``append_file`` call the worker ``pid``
        started, whose outcome is not stored and whose line is not written yet."""
        record = self.record.refresh()
        turns = record.by_turn()
        root = self.c.settings.sandbox_root
        for e in reversed(record.events[-500:]):
            if e.topic != "ToolCallStarted" or e.payload["effect"] != "side_effecting":
                continue
            if worker_pid(str(e.payload["worker_id"])) != pid:
                continue
            call_id = str(e.payload["call_id"])
            events = turns.get(str(e.payload["turn_id"]), [])
            if _over(events, e, call_id):
                continue
            name, arguments = call_names(events).get(call_id, ("", {}))
            marker = str(arguments.get("text", ""))
            if name in PROBED and marker and not marker_written(root, e.session_id, marker):
                return e.session_id, call_id, marker
        return None

    def _acknowledged(self) -> list[str]:
        with self.workload.lock:
            return list(self.workload.acknowledged)

    def _killed_workers(self) -> set[int]:
        return {k.pid for k in self.kills if k.role == "worker"}

    # --------------------------------------------------------------- the end

    def finish(self) -> dict[str, Any]:
        """Stop the clients, let every turn settle, check the whole record; the figures."""
        self.workload.finish()
        if self.workload.errors:
            raise AssertionError("; ".join(self.workload.errors))
        with self.workload.lock:
            markers = dict(self.workload.markers)
        acknowledged = self._acknowledged()
        findings = check(
            self.record.refresh(), acknowledged, self._killed_workers(), markers, self.probed
        )
        self.unrecorded = self.operator_actions_unrecorded()
        return self.figures(findings)

    def operator_actions_unrecorded(self) -> list[str]:
        """Each cancel and decision the API acknowledged (200) that its turn's record lacks,
        and any decision recorded other than the one asked."""
        turns = self.record.by_turn()
        with self.workload.lock:
            cancels = dict(self.workload.cancels)
            decisions = dict(self.workload.decisions)
        missing = []
        for turn_id, (_, reason, answer) in cancels.items():
            recorded = any(
                e.topic in ("TurnCancelled", "CancelRequested") and e.payload["reason"] == reason
                for e in turns.get(turn_id, [])
            )
            if answer == 200 and not recorded:
                missing.append(f"cancel of {turn_id} acknowledged, not on record")
        topics = {"approved": "ToolCallApproved", "rejected": "ToolCallRejected"}
        for call_id, (_, turn_id, decision, answer) in decisions.items():
            found = [
                e.topic
                for e in turns.get(turn_id, [])
                if e.topic in topics.values() and e.payload["call_id"] == call_id
            ]
            if answer == 200 and found != [topics[decision]]:
                missing.append(f"{decision} {call_id} acknowledged; on record: {found}")
            elif found and found != [topics[decision]]:
                missing.append(f"{decision} {call_id} asked; on record: {found}")
        return missing

    def figures(self, findings: Any) -> dict[str, Any]:
        turns = self.record.by_turn()
        states = [final_state(turns.get(t, [])) for t in self._acknowledged()]
        outcomes = [o for r in self.rounds for o in r.outcome.values()]
        takeover = takeover_latencies(self.record, self.kills)
        restore = {
            role: [k.restored_after for k in self.kills if k.role == role and k.restored_after]
            for role in ("api", "projections", "worker")
        }
        events = self.record.events
        interrupted = {str(e.payload["turn_id"]) for e in events if e.topic == "TurnInterrupted"}
        figures = {
            "kills": len(self.kills),
            "kills by role": {r: sum(k.role == r for k in self.kills) for r in restore},
            "turns acknowledged": len(states),
            "turns completed": states.count("completed"),
            "turns abandoned (by the operator, after an interruption)": states.count("abandoned"),
            "turns cancelled (by the clients)": states.count("cancelled"),
            "turns not finished": len(states)
            - states.count("completed")
            - states.count("abandoned")
            - states.count("cancelled"),
            "cancels asked / acknowledged": (
                len(self.workload.cancels),
                sum(a == 200 for *_, a in self.workload.cancels.values()),
            ),
            "calls approved / rejected (acknowledged)": (
                sum(d == "approved" and a == 200 for *_, d, a in self.workload.decisions.values()),
                sum(d == "rejected" and a == 200 for *_, d, a in self.workload.decisions.values()),
            ),
            "operator actions not on record": len(self.unrecorded),
            "turns resumed after their worker died": outcomes.count("resumed"),
            "turns interrupted (side-effecting call in flight)": outcomes.count("interrupted")
            + outcomes.count("probed: unknown"),
            "turns interrupted (on record)": len(interrupted),
            "calls resolved by the operator": self.workload.operator["resolved"],
            "client requests retried (API down or restarting)": self.workload.retries,
            "lost": len(findings.lost),
            "duplicates": len(findings.duplicate_effects),
            "invariant violations": sum(findings.counts().values())
            + sum(len(r.problems) for r in self.rounds)
            + len(self.unrecorded),
            "round problems": [p for r in self.rounds for p in r.problems][:20]
            + self.unrecorded[:20],
            "findings": findings.counts(),
            "load average (1 min) at the kills, min / p50 / max": (
                percentile(self.loads, 0.0),
                percentile(self.loads, 0.5),
                percentile(self.loads, 1.0),
            ),
            "worker takeover latency p50 (s)": percentile(takeover, 0.5),
            "worker takeover latency max (s)": max(takeover, default=None),
            **{
                f"{role} restored p50 / max (s)": (percentile(v, 0.5), percentile(v, 1.0))
                for role, v in restore.items()
            },
        }
        if self.probes:
            figures.update(self.probe_figures(findings, outcomes))
        return figures

    def probe_figures(self, findings: Any, outcomes: list[str]) -> dict[str, Any]:
        """What the probes did: per kill round, on record, and against the interruptions."""
        events = self.record.events
        answers = Counter(str(e.payload["answer"]) for e in events if e.topic == "ToolCallProbed")
        by_probe = Counter(
            str(e.payload["outcome"])
            for e in events
            if e.topic == "ToolCallResolved" and str(e.payload["actor"]).startswith(PROBE_ACTOR)
        )
        interrupted = {str(e.payload["turn_id"]) for e in events if e.topic == "TurnInterrupted"}
        unexplained = {i.split("/")[0] for i in findings.interrupted_without_unknown_probe}
        in_flight = [o for o in outcomes if o == "interrupted" or o.startswith("probed")]
        kinds = ("applied", "not_applied", "unknown")
        return {
            "probes": "on (TURNLOG_PROBES=1 in every process); probed tools: "
            + ", ".join(sorted(self.probed)),
            "worker kills aimed after a write / hit the window": (
                len(self.aimed),
                self.aimed.count("hit"),
            ),
            "side-effecting calls in flight at a worker kill": len(in_flight),
            "of them settled by the probe, per round (applied / not_applied / unknown)": tuple(
                outcomes.count(f"probed: {k}") for k in kinds
            ),
            "probe answers on record (applied / not_applied / unknown)": tuple(
                answers[k] for k in kinds
            ),
            "calls resolved by a probe (succeeded / failed)": (
                by_probe["succeeded"],
                by_probe["failed"],
            ),
            "turns interrupted after an unknown probe answer": len(interrupted - unexplained),
            "interrupted without an unknown probe answer": len(unexplained),
        }

    def verify_with_cli(self) -> list[str]:
        """``turnlog audit ID --verify`` for every session, then ``turnlog projections verify``."""
        head = self.record.refresh().position
        poll(lambda: self._caught_up(head), self.deadline(60), "the read models catching up")
        failures = []
        for session_id in self.record.session_ids():
            done = turnlog(self.c.settings, "audit", session_id, "--verify")
            if done.returncode != 0:
                failures.append(f"audit {session_id} --verify: {done.stdout[-2000:]}")
        done = turnlog(self.c.settings, "projections", "verify")
        if done.returncode != 0:
            failures.append(f"projections verify: {done.stdout[-2000:]}")
        return failures

    def _caught_up(self, head: int) -> bool:
        response = httpx.get(f"{self.c.api_url}/v1/projections", timeout=10)
        return all(item["position"] >= head for item in response.json()["items"])

    def close(self) -> None:
        self.workload.stop.set()
        self.record.close()
