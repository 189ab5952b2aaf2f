"""Writer processes for the log-order stress test (kept light: spawned processes import this)."""

from __future__ import annotations

import threading
import time
from uuid import UUID

from psycopg import sql

from turnlog.application.settings import Settings
from turnlog.application.store.database import locate
from turnlog.domain.session import Session
from turnlog.interface.bootstrap import open_sessions
from turnlog.projections.log import EventLog

PROCESSES = 4
THREADS = 4  # per process: 16 writers
CYCLES = 3  # turns per session (submit, claim, complete: 3 events each)


def writer_process(settings_json: str, sessions: list[str], hold_app: str) -> None:
    """THREADS threads, each running CYCLES turns on its share of ``sessions``."""
    settings = Settings.model_validate_json(settings_json)
    log = EventLog(open_sessions(settings, locate(settings)))
    app = log.sessions
    if hold_app:
        threading.Thread(target=_hold_insert, args=(log, hold_app), daemon=True).start()
    shares = [sessions[i::THREADS] for i in range(THREADS)]

    def work(share: list[str]) -> None:
        for cycle in range(CYCLES):
            for key in share:
                sid = UUID(key)
                (turn, _), _ = app.update(sid, lambda s, c=cycle: s.submit_turn(f"m{c}"))
                claim, _ = app.update(sid, lambda s, t=turn.turn_id: s.claim_turn(t, "w"))
                app.update(sid, lambda s, t=turn.turn_id, c=claim: s.complete_turn(t, c, "done"))

    threads = [threading.Thread(target=work, args=(share,)) for share in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    app.close()


def _hold_insert(log: EventLog, app_name: str) -> None:
    """Insert a new session's first event in a transaction left open (until killed)."""
    event = Session.start(title="never committed").collect_events()[0]
    stored = log.sessions.mapper.to_stored_event(event)
    with log.datastore.get_connection() as conn:
        conn.execute(sql.SQL("SET application_name = {}").format(sql.Literal(app_name)))
        conn.autocommit = False
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (originator_id, originator_version, topic, state)"
                " VALUES (%s, %s, %s, %s)"
            ).format(log.table),
            (stored.originator_id, stored.originator_version, stored.topic, stored.state),
        )
        time.sleep(3600)  # the process is killed meanwhile
