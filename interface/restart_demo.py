"""``turnlog demo restart``: the seed experiment over HTTP, with real process deaths.

It starts a real ``turnlog serve``, stores a codeword, SIGKILLs the server,
starts a replacement with the same namespace and settings, finds the session
through the API and recalls the codeword. Then it shows the boundary: a
side-effecting tool call killed mid-flight, the turn interrupted, a new turn
refused, inspection, abandonment, a new turn accepted — and the tool's file
written at most once. Then the same kill with outcome probes on
(``TURNLOG_PROBES=1``), this time after the line is written and before its
result is recorded: the replacement asks ``append_file``'s probe, records its
answer and evidence, and the turn continues by itself — the file written
exactly once. Every step goes into a JSON receipt.

Every wait polls against a deadline stretched by the machine's load, so a
busy machine makes the demo slower, not wrong.
"""

from __future__ import annotations

import json
import random
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
from psycopg import sql

from turnlog.application.settings import Settings
from turnlog.interface.demo_support import DemoFailed, Receipt, Server, Step, free_port, scaled


class RestartDemo:
    """The steps, each recorded in the receipt as it happens."""

    def __init__(self, settings: Settings, say: Callable[[str], None], word: str = "") -> None:
        self.settings = settings
        self.say = say
        self.word = word or random.choice(
            ["amber", "basalt", "cobalt", "ember", "fjord", "garnet", "juniper", "quartz"]
        )
        self.receipt = Receipt(namespace=settings.namespace, started_at=time.time())
        self.log_path = settings.data_dir.resolve() / "demo-serve.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.server: Server | None = None

    def step(self, name: str, ok: bool, detail: str, t0: float, **data: Any) -> None:
        self.receipt.steps.append(Step(name, ok, detail, round(time.monotonic() - t0, 3), data))
        mark = "ok  " if ok else "FAIL"
        self.say(f"[{mark}] {name}: {detail}")
        if not ok:
            raise DemoFailed(f"{name}: {detail}")

    def start_server(self, label: str, **extra_env: str) -> Server:
        t0 = time.monotonic()
        server = Server(self.settings, self.port, self.log_path, **extra_env)
        ready = server.wait_ready()
        self.step(
            label,
            True,
            f"pid {server.proc.pid} ready in {ready:.2f}s",
            t0,
            pid=server.proc.pid,
            port=self.port,
        )
        self.server = server
        return server

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        assert self.server is not None
        return httpx.request(method, f"{self.server.url}{path}", timeout=90, **kwargs)

    def run(self) -> Receipt:
        try:
            self._codeword_across_a_kill()
            self._unknown_outcome_boundary()
            self._probed_outcome_boundary()
            self.receipt.ok = True
        finally:
            if self.server is not None and self.server.proc.poll() is None:
                self.server.kill(signal.SIGTERM)
        return self.receipt

    def _codeword_across_a_kill(self) -> None:
        server = self.start_server("start server")
        t0 = time.monotonic()
        created = self.api("POST", "/v1/sessions", json={"title": "restart demo"})
        self.session_id = created.json().get("session_id", "")
        self.step(
            "create session",
            created.status_code == 201,
            self.session_id,
            t0,
            position=created.json().get("position"),
        )
        t0 = time.monotonic()
        turn = self.api(
            "POST",
            f"/v1/sessions/{self.session_id}/turns",
            params={"wait": 30},
            json={"message": f"The codeword is {self.word}"},
        ).json()
        self.step(
            "store codeword",
            turn.get("state") == "completed",
            repr(turn.get("reply")),
            t0,
            position=turn.get("position"),
            reply=turn.get("reply"),
        )
        t0 = time.monotonic()
        code = server.kill()
        self.step(
            "SIGKILL server",
            code == -signal.SIGKILL,
            f"pid {server.proc.pid} exit {code}",
            t0,
            pid=server.proc.pid,
        )
        self.start_server("start replacement")
        t0 = time.monotonic()
        listed = self.api("GET", "/v1/sessions", params={"limit": 100}).json()
        ids = [row.get("session_id") for row in listed.get("items", [])]
        self.step(
            "discover session", self.session_id in ids, f"found among {len(ids)} sessions", t0
        )
        t0 = time.monotonic()
        turn = self.api(
            "POST",
            f"/v1/sessions/{self.session_id}/turns",
            params={"wait": 30},
            json={"message": "What is the codeword?"},
        ).json()
        reply = str(turn.get("reply", ""))
        self.step(
            "recall codeword",
            self.word in reply,
            repr(reply),
            t0,
            reply=reply,
            position=turn.get("position"),
        )

    def _unknown_outcome_boundary(self) -> None:
        assert self.server is not None
        sid = self.session_id
        t0 = time.monotonic()
        call = '/tool append_file {"path": "demo.txt", "text": "written once", "delay_seconds": 5}'
        turn = self.api("POST", f"/v1/sessions/{sid}/turns", json={"message": call}).json()
        turn_id = turn.get("turn_id", "")
        started = self._poll_turn(
            turn_id, lambda t: any(c["state"] == "started" for c in t.get("tool_calls", []))
        )
        self.step(
            "side-effecting call in flight",
            started is not None,
            "append_file started, waiting 5 s before it writes",
            t0,
            turn_id=turn_id,
        )
        t0 = time.monotonic()
        code = self.server.kill()
        self.step(
            "SIGKILL server mid-call",
            code == -signal.SIGKILL,
            f"pid {self.server.proc.pid} exit {code}",
            t0,
            pid=self.server.proc.pid,
        )
        self.start_server("start replacement")
        t0 = time.monotonic()
        interrupted = self._poll_turn(turn_id, lambda t: t.get("state") == "interrupted")
        self.step(
            "turn interrupted",
            interrupted is not None,
            "the call's outcome is unknown; nothing re-ran it",
            t0,
        )
        assert interrupted is not None
        call_id = interrupted["unknown_call_ids"][0]
        t0 = time.monotonic()
        refused = self.api("POST", f"/v1/sessions/{sid}/turns", json={"message": "hello"})
        body = refused.json()
        self.step(
            "new turn refused",
            refused.status_code == 409
            and body.get("code") == "unresolved_turn"
            and call_id in json.dumps(body),
            f"{refused.status_code} {body.get('code')} naming {call_id}",
            t0,
        )
        t0 = time.monotonic()
        inspected = self.api("GET", f"/v1/sessions/{sid}/turns/{turn_id}").json()
        calls = [c for c in inspected.get("tool_calls", []) if c["call_id"] == call_id]
        self.step(
            "inspect",
            bool(calls) and calls[0]["state"] == "unknown",
            f"{calls[0]['name']} {json.dumps(calls[0]['arguments'])} attempt "
            f"{calls[0]['attempt']} started {calls[0]['started_at']}"
            if calls
            else "-",
            t0,
        )
        t0 = time.monotonic()
        abandoned = self.api(
            "POST",
            f"/v1/sessions/{sid}/turns/{turn_id}/abandon",
            json={"reason": "demo: checked, nothing to undo", "actor": "demo"},
        )
        self.step(
            "abandon",
            abandoned.status_code == 200,
            f"{abandoned.status_code}",
            t0,
            position=abandoned.json().get("position"),
        )
        t0 = time.monotonic()
        turn = self.api(
            "POST", f"/v1/sessions/{sid}/turns", params={"wait": 30}, json={"message": "hello"}
        ).json()
        self.step(
            "new turn accepted",
            turn.get("state") == "completed",
            repr(turn.get("reply")),
            t0,
            reply=turn.get("reply"),
        )
        t0 = time.monotonic()
        path = self.settings.sandbox_root / sid / "demo.txt"
        lines = path.read_text().splitlines() if path.exists() else []
        self.step(
            "written at most once",
            len(lines) <= 1,
            f"{path.name} has {len(lines)} line(s)",
            t0,
            lines=len(lines),
        )

    def _probed_outcome_boundary(self) -> None:
        """The same kill mid-``append_file``, probes on: settled from evidence, by itself.

        The kill falls after the line is written and before its result is
        recorded — the one window where only the outside world knows. The demo
        holds back inserts into the log (a table lock, reads still served)
        from the moment the call has started until the server is dead, so the
        window is hit every time instead of by luck.
        """
        from turnlog.application.store.database import locate

        assert self.server is not None
        sid = self.session_id
        t0 = time.monotonic()
        pid = self.server.proc.pid
        code = self.server.kill(signal.SIGTERM)
        self.step(
            "stop server",
            code in (0, -signal.SIGTERM),
            f"pid {pid} exit {code} (SIGTERM)",
            t0,
            pid=pid,
        )
        self.start_server("start server with probes on", TURNLOG_PROBES="1")

        conninfo = locate(self.settings).conninfo
        recorded_before = self._succeeded_calls(conninfo, sid)
        # Long enough to hold back the log's inserts before the write, on a busy machine too.
        delay = round(min(scaled(3.0), 60.0), 1)
        text = "written exactly once"
        arguments = {"path": "probed.txt", "text": text, "delay_seconds": delay}
        path = self.settings.sandbox_root / sid / "probed.txt"
        t0 = time.monotonic()
        turn = self.api(
            "POST",
            f"/v1/sessions/{sid}/turns",
            json={"message": f"/tool append_file {json.dumps(arguments)}"},
        ).json()
        turn_id = turn.get("turn_id", "")
        started = self._poll_turn(
            turn_id, lambda t: any(c["state"] == "started" for c in t.get("tool_calls", []))
        )
        self.step(
            "side-effecting call in flight, probes on",
            started is not None,
            f"append_file started, writing in {delay:g} s",
            t0,
            turn_id=turn_id,
            delay_seconds=delay,
        )
        with psycopg.connect(conninfo) as conn:  # one transaction: the lock lasts until rollback
            t0 = time.monotonic()
            conn.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(self._log_table()))
            recorded = self._succeeded_calls(conninfo, sid, conn)
            self.step(
                "log's inserts held",
                recorded == recorded_before,
                "the call's result cannot be recorded until the kill"
                if recorded == recorded_before
                else "the call finished before the inserts were held (machine too slow)",
                t0,
            )
            t0 = time.monotonic()
            written = self._poll(lambda: path.exists() and path.read_text() == text + "\n", delay)
            self.step(
                "line written, its result not recorded",
                written,
                f"{path.name} has its line; the record still says started",
                t0,
            )
            t0 = time.monotonic()
            code = self.server.kill()
            try:
                # An insert the dead server left waiting for the lock must not commit.
                waiting = conn.execute(
                    "SELECT pid FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                    (self._log_table_name(),),
                ).fetchall()
                for (backend,) in waiting:
                    conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
                recorded = self._succeeded_calls(conninfo, sid, conn)
            finally:
                conn.rollback()
            self.step(
                "SIGKILL server mid-call, probes on",
                code == -signal.SIGKILL and recorded == recorded_before,
                f"pid {self.server.proc.pid} exit {code}; no result on record",
                t0,
                pid=self.server.proc.pid,
                results_recorded=recorded - recorded_before,
            )
        self.start_server("start replacement with probes on", TURNLOG_PROBES="1")
        t0 = time.monotonic()
        finished = self._poll_turn(
            turn_id, lambda t: t.get("state") in ("completed", "interrupted")
        )
        state = finished.get("state") if finished else None
        self.step(
            "turn continued by itself",
            state == "completed",
            f"{state}: {finished.get('reply') if finished else '-'!r}",
            t0,
            state=state,
            reply=finished.get("reply") if finished else None,
        )
        assert finished is not None
        t0 = time.monotonic()
        call = finished["tool_calls"][0]
        probes = call.get("probes", [])
        answers = [p["answer"] for p in probes]
        self.step(
            "probe on record",
            answers == ["applied"]
            and call["state"] == "resolved"
            and call["outcome"] == "succeeded"
            and call["actor"] == "probe:append_file"
            and call["result"] == {"path": "probed.txt", "bytes": len(text) + 1},
            f"{call['name']} {call['state']} {call['outcome']} by {call['actor']}, "
            f"probe answered {answers}, result {json.dumps(call['result'])}",
            t0,
            answers=answers,
            outcome=call["outcome"],
            actor=call["actor"],
            result=call["result"],
            evidence=call.get("evidence", {}),
            probe_seconds=[p["duration_seconds"] for p in probes],
        )
        t0 = time.monotonic()
        lines = path.read_text().splitlines() if path.exists() else []
        self.step(
            "written exactly once",
            lines == [text],
            f"{path.name} has {len(lines)} line(s)",
            t0,
            lines=len(lines),
        )

    def _log_table_name(self) -> str:
        return f"{self.settings.schema_name}.sessions_events"

    def _log_table(self) -> sql.Composable:
        return sql.Identifier(self.settings.schema_name, "sessions_events")

    def _succeeded_calls(
        self, conninfo: str, session_id: str, conn: psycopg.Connection[Any] | None = None
    ) -> int:
        """How many ToolCallSucceeded events the session's stream holds."""
        query = sql.SQL(
            "SELECT count(*) FROM {} WHERE originator_id = %s AND topic LIKE %s"
        ).format(self._log_table())
        params = (uuid.UUID(session_id), "%.ToolCallSucceeded.%")
        if conn is not None:
            row = conn.execute(query, params).fetchone()
        else:
            with psycopg.connect(conninfo, autocommit=True) as own:
                row = own.execute(query, params).fetchone()
        return int(row[0]) if row else 0

    def _poll(self, done: Callable[[], bool], base: float, deadline: float = 20.0) -> bool:
        start = time.monotonic()
        while time.monotonic() - start < base + scaled(deadline):
            if done():
                return True
            time.sleep(0.05)
        return done()

    def _poll_turn(
        self, turn_id: str, done: Callable[[dict[str, Any]], bool], deadline: float = 20.0
    ) -> dict[str, Any] | None:
        start = time.monotonic()
        while time.monotonic() - start < scaled(deadline):
            response = self.api("GET", f"/v1/sessions/{self.session_id}/turns/{turn_id}")
            if response.status_code == 200 and done(response.json()):
                return dict(response.json())
            time.sleep(0.1)
        return None
