"""Histories for read-model tests: one scripted, and bulk ones for catch-up and benchmarks.

Every event is a real event: recorded by the Session aggregate's own
commands (through the executor where a real turn runs) and saved through the
Sessions application's mapper and recorder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from turnlog.application.runtime import Runtime
from turnlog.application.sessions import Sessions
from turnlog.domain.session import Session, retaining
from turnlog.domain.turns import Effect

WORKER = "test-worker"
ACTOR = "operator:test"


@dataclass
class Scripted:
    """Ids of what the scripted history made, by the role they play."""

    sessions: dict[str, UUID] = field(default_factory=dict)
    turns: dict[str, str] = field(default_factory=dict)
    calls: dict[str, str] = field(default_factory=dict)
    last_position: int = 0


def scripted_history(rt: Runtime) -> Scripted:
    """Turns completed, failed, interrupted, abandoned and resolved; calls in every state.

    Sessions (by role): ``done`` (four finished turns: plain, tool succeeded,
    tool failed, turn failed), ``blocked`` (interrupted, call unknown),
    ``abandoned`` (interrupted then abandoned: one call abandoned, one never
    started), ``resolved`` (interrupted, resolved, then completed),
    ``queued``, ``pending`` (a requested call not started), ``started``
    (a safe call in flight) and ``closed``.
    """
    out = Scripted()
    tools = rt.executor.tools.names()

    def new(role: str) -> UUID:
        out.sessions[role] = rt.sessions.create_session(title=role, tools=tools).session_id
        return out.sessions[role]

    def run(role: str, message: str) -> str:
        sid = out.sessions[role]
        turn_id = rt.sessions.submit_turn(sid, message).turn_id
        rt.executor.run_turn(sid, turn_id)
        return turn_id

    new("done")
    out.turns["completed"] = run("done", "The codeword is kiwi")
    out.turns["tool_succeeded"] = run("done", '/tool echo {"text": "x"}')
    out.turns["tool_failed"] = run("done", '/tool sleep {"seconds": "soon"}')
    out.turns["failed"] = run("done", "/tool nosuch {}")
    # The full record: the session as loaded keeps only a summary of finished turns.
    done = rt.sessions.get_record(out.sessions["done"])
    out.calls["succeeded"] = done.turn(out.turns["tool_succeeded"]).call_ids[0]
    out.calls["failed"] = done.turn(out.turns["tool_failed"]).call_ids[0]
    out.calls["not_run"] = done.turn(out.turns["failed"]).call_ids[0]

    out.turns["interrupted"], [out.calls["unknown"]] = _interrupted(rt, new("blocked"), ["u1"])
    out.turns["abandoned"], [out.calls["abandoned"], out.calls["abandoned_pending"]] = _interrupted(
        rt, new("abandoned"), ["a1", "a2"]
    )
    rt.sessions.abandon_turn(out.sessions["abandoned"], out.turns["abandoned"], "gave up", ACTOR)
    out.turns["resolved"], [out.calls["resolved"]] = _interrupted(rt, new("resolved"), ["r1"])
    sid = out.sessions["resolved"]
    rt.sessions.resolve_tool_call(
        sid, out.calls["resolved"], "succeeded", {"ok": 1}, "checked", ACTOR
    )
    rt.executor.run_turn(sid, out.turns["resolved"])

    out.turns["queued"] = rt.sessions.submit_turn(new("queued"), "later").turn_id
    out.turns["pending"], out.calls["pending"] = _replied(rt, new("pending"), "p1", start=False)
    out.turns["started"], out.calls["started"] = _replied(rt, new("started"), "s1", start=True)

    new("closed")
    out.turns["closed_turn"] = run("closed", "hello")
    written = rt.sessions.close_session(out.sessions["closed"], "finished", ACTOR)
    out.last_position = written.position or 0
    return out


def _claimed(rt: Runtime, sid: UUID, message: str) -> tuple[str, int]:
    turn_id = rt.sessions.submit_turn(sid, message).turn_id
    claim, _ = rt.sessions.update(sid, lambda s: s.claim_turn(turn_id, WORKER))
    return turn_id, claim


def _interrupted(rt: Runtime, sid: UUID, call_ids: list[str]) -> tuple[str, list[str]]:
    """A turn whose owner died inside the first of ``call_ids`` (an unsafe call)."""
    turn_id, claim = _claimed(rt, sid, "/tool append_file")
    calls = [
        {"call_id": c, "name": "append_file", "arguments": {"path": "f", "text": "x"}}
        for c in call_ids
    ]
    rt.sessions.update(sid, lambda s: s.record_model_reply(turn_id, claim, "", calls))
    rt.sessions.update(
        sid,
        lambda s: s.start_tool_call(turn_id, claim, call_ids[0], WORKER, Effect.SIDE_EFFECTING),
    )
    rt.sessions.update(sid, lambda s: s.interrupt_turn(turn_id, WORKER))
    return turn_id, call_ids


def _replied(rt: Runtime, sid: UUID, call_id: str, *, start: bool) -> tuple[str, str]:
    """A running turn with one echo call requested (and started, if ``start``)."""
    turn_id, claim = _claimed(rt, sid, '/tool echo {"text": "y"}')
    call = {"call_id": call_id, "name": "echo", "arguments": {"text": "y"}}
    rt.sessions.update(sid, lambda s: s.record_model_reply(turn_id, claim, "", [call]))
    if start:
        rt.sessions.update(
            sid, lambda s: s.start_tool_call(turn_id, claim, call_id, WORKER, Effect.READ_ONLY)
        )
    return turn_id, call_id


# ------------------------------------------------------------------ bulk


def bulk_session(index: int, turns: int, *, retain: bool = True) -> Session:
    """A session driven through ``turns`` turns of varied endings, in memory (not saved).

    By default a retaining session (every turn kept in full), as audit replays
    one to compare with read models; ``retain=False`` gives the bounded session
    the application saves and snapshots. The events are the same either way.
    """
    s = Session.start(
        title=f"bulk {index}", tools=["echo", "append_file"], created_by="bulk", model="fixture-1"
    )
    if retain:
        retaining(s)
    for t in range(turns):
        _bulk_turn(s, (index + t) % 6, f"{index}-{t}")
    return s


def _bulk_turn(s: Session, kind: int, tag: str) -> None:
    turn, _ = s.submit_turn(f"message {tag}")
    tid = turn.turn_id
    claim = s.claim_turn(tid, WORKER)
    if kind == 0:
        s.record_model_reply(tid, claim, f"Echo: {tag}", [])
        s.complete_turn(tid, claim, f"Echo: {tag}")
        return
    name = "echo" if kind in (1, 2, 3) else "append_file"
    effect = Effect.READ_ONLY if name == "echo" else Effect.SIDE_EFFECTING
    calls: list[dict[str, Any]] = [{"call_id": f"c{tag}", "name": name, "arguments": {"t": tag}}]
    s.record_model_reply(tid, claim, "", calls)
    if kind == 3:  # a provider error before the call ran
        s.fail_turn(tid, claim, "provider error: timeout")
        return
    attempt = s.start_tool_call(tid, claim, f"c{tag}", WORKER, effect)
    if kind == 1:
        s.record_tool_succeeded(tid, claim, f"c{tag}", attempt, {"echo": tag})
    elif kind == 2:
        s.record_tool_failed(tid, claim, f"c{tag}", attempt, "tool error: bad input")
    else:
        s.interrupt_turn(tid, WORKER)
        if kind == 5:
            s.abandon_turn(tid, "operator gave up", ACTOR)
            return
        s.resolve_tool_call(f"c{tag}", "succeeded", {"done": True}, "checked by hand", ACTOR)
        claim = s.claim_turn(tid, WORKER)
    s.record_model_reply(tid, claim, f"done {tag}", [])
    s.complete_turn(tid, claim, f"done {tag}")


def bulk_history(sessions: Sessions, events: int, turns_per_session: int = 8) -> int:
    """Save sessions until the log holds at least ``events`` more events; returns the count."""
    saved = 0
    index = 0
    while saved < events:
        # Ten sessions (~500 events) per save: the library's pipelined insert
        # stalls on much larger saves (seen with ~2,500 events in one save).
        batch = []
        for _ in range(10):
            batch.append(bulk_session(index, turns_per_session, retain=False))
            index += 1
        saved += sum(len(s.pending_events) for s in batch)
        sessions.save(*batch)
    return saved
