"""Soak: 4 workers, 200 turns with tool calls, a worker SIGKILLed every few seconds.

Run with ``python tests/benchmarks/soak_workers.py [--turns 200] [--workers 4]``
(``make soak``). It starts a separate API, projection runner and workers on
the embedded PostgreSQL (or ``TURNLOG_TEST_DATABASE_URL``) in a fresh
namespace, drives turns from several client threads, kills a random worker
every 2 to 4 s and restarts it, then checks the record:

- every acknowledged turn is in the log;
- no side-effecting call ran twice (each call writes a unique marker line);
- every interrupted turn's unknown call is side-effecting and was in flight;
- recovery latency: kill → the next claim or interruption of a turn it held.

The turn mix and the checks of the record are shared with the kill campaign
(tests/fault/campaign.py and record.py, ``make chaos``).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from tests.fault.campaign import message_for  # noqa: E402
from tests.fault.cluster import Cluster, Process  # noqa: E402
from tests.fault.record import Kill, Record, check, final_state, takeover_latencies  # noqa: E402
from turnlog.application.settings import Settings  # noqa: E402
from turnlog.application.store.database import locate  # noqa: E402

FINISHED = {"completed", "failed", "interrupted", "abandoned"}


class Soak:
    def __init__(self, c: Cluster, turns: int, workers: int, clients: int) -> None:
        self.c = c
        self.turns = turns
        self.worker_count = workers
        self.clients = clients
        self.workers: list[Process] = []
        self.kills: list[Kill] = []
        self.acknowledged: list[tuple[str, str, str]] = []  # (session, turn, kind)
        self.interrupted = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.counter = 0

    def next_index(self) -> int | None:
        with self.lock:
            if self.counter >= self.turns:
                return None
            self.counter += 1
            return self.counter

    def client(self) -> None:
        session_id = self.c.new_session()
        while (i := self.next_index()) is not None:
            kind, message, _ = message_for(i)
            response = self.c.submit(session_id, message)
            if response.status_code != 202:
                raise AssertionError(f"submit refused: {response.status_code} {response.text}")
            turn_id = response.json()["turn_id"]
            with self.lock:
                self.acknowledged.append((session_id, turn_id, kind))
            turn = self.wait_finished(session_id, turn_id)
            if turn["state"] == "interrupted":
                with self.lock:
                    self.interrupted += 1
                self.c.request(
                    "POST",
                    f"/v1/sessions/{session_id}/turns/{turn_id}/abandon",
                    json={"reason": "soak: outcome unknown", "actor": "soak"},
                )

    def wait_finished(self, session_id: str, turn_id: str) -> dict[str, Any]:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            turn = self.c.turn(session_id, turn_id)
            if turn["state"] in FINISHED:
                return turn
            time.sleep(0.05)
        raise AssertionError(f"turn {turn_id} did not finish")

    def killer(self) -> None:
        rng = random.Random(7)
        while not self.done.wait(rng.uniform(2.0, 4.0)):
            index = rng.randrange(len(self.workers))
            victim = self.workers[index]
            self.kills.append(Kill(time.time(), "worker", victim.pid))
            victim.kill()
            self.workers[index] = self.c.worker(f"w{index}-{len(self.kills)}")

    def run(self) -> dict[str, Any]:
        self.workers = [self.c.worker(f"w{i}") for i in range(self.worker_count)]
        started = time.monotonic()
        clients = [threading.Thread(target=self.client) for _ in range(self.clients)]
        killer = threading.Thread(target=self.killer, daemon=True)
        for t in clients:
            t.start()
        killer.start()
        for t in clients:
            t.join()
        self.done.set()
        killer.join(timeout=30)
        elapsed = time.monotonic() - started
        return self.check(elapsed)

    def check(self, elapsed: float) -> dict[str, Any]:
        """The record's invariants (tests/fault/record.py, shared with the kill campaign)."""
        record = Record(self.c.settings, self.c.database).refresh()
        try:
            findings = check(record, [t for _, t, _ in self.acknowledged])
            by_turn = record.by_turn()
            latencies = takeover_latencies(record, self.kills)
        finally:
            record.close()
        states = Counter(final_state(events) for events in by_turn.values())
        return {
            "turns acknowledged": len(self.acknowledged),
            "turns completed": states.get("completed", 0),
            "turns failed": states.get("failed", 0),
            "turns interrupted": self.interrupted,
            "interruptions not justified by an unsafe call in flight": len(
                findings.unjustified_interruptions
            ),
            "turns re-claimed after a kill": sum(
                1 for ev in by_turn.values() if sum(e.topic == "TurnClaimed" for e in ev) > 1
            ),
            "kills": len(self.kills),
            "lost": len(findings.lost),
            "duplicate side effects": len(findings.duplicate_effects),
            "recovery latency p50 (s)": round(median(latencies), 3) if latencies else None,
            "recovery latency max (s)": round(max(latencies), 3) if latencies else None,
            "elapsed (s)": round(elapsed, 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--json", type=Path, default=ROOT / ".turnlog" / "soak.json")
    args = parser.parse_args()
    import os
    import tempfile

    url = os.environ.get("TURNLOG_TEST_DATABASE_URL")
    base = Settings(database_url=url) if url else Settings(data_dir=ROOT / ".turnlog" / "test")
    database = locate(base)
    namespace = f"soak_{uuid.uuid4().hex[:8]}"
    data_dir = Path(tempfile.mkdtemp(prefix="turnlog-soak-"))
    settings = Settings(database_url=database.conninfo, namespace=namespace, data_dir=data_dir)
    c = Cluster(settings, database)
    try:
        c.api("api")
        c.projections()
        report = Soak(c, args.turns, args.workers, args.clients).run()
    finally:
        c.stop_all()
        with psycopg.connect(database.conninfo, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    sql.Identifier(settings.schema_name)
                )
            )
    print("| figure | value |\n|---|---|")
    for key, value in report.items():
        print(f"| {key} | {value} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    ok = (
        report["lost"] == 0
        and report["duplicate side effects"] == 0
        and report["interruptions not justified by an unsafe call in flight"] == 0
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
