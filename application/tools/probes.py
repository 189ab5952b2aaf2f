"""Outcome probes: settle a call whose owner died mid-call from evidence, never by replay.

A side-effecting call in flight when its owner died has an unknown outcome.
A tool may declare a *probe* that asks the outside system what happened:
did the line land, was the row written? The probe gets the call's
arguments, its idempotency key and the *pre-state* the tool recorded in the
intent (ToolCallStarted) before it ran, and answers exactly one of:

- ``applied`` with a JSON ``result`` — the call took effect; the result
  becomes the call's result;
- ``not_applied`` — the call left no effect;
- ``unknown`` with a ``note`` — the probe cannot tell.

Command and Python probes answer with one JSON object on the last line of
stdout, exit code 0: ``{"answer": "applied", "result": {...}}``. Anything
else — another exit code, a timeout, no JSON, an unknown answer, ``applied``
without a result — is ``unknown``, with what the probe printed (truncated)
kept as evidence. Never success. A probe is asked on a thread of its own and
waited for at most its timeout and a margin: one stuck in a system call is
``unknown``, and recovery goes on.

Recovery (``settle``) runs a probe only after it has claimed the turn
(fencing the old owner) and checked that neither the owning process nor any
process the attempt spawned is still alive (pid *and* start time, on this
host); a process that may still be alive means no probe, and the turn is
interrupted as before.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.processes import identify, is_alive, is_here
from turnlog.application.tools.sandbox_files import (
    SandboxPathError,
    file_state,
    path_parts,
    read_at,
)
from turnlog.domain.turns import ProbeAnswer, ToolCall, ToolProcess

log = logging.getLogger("turnlog.probes")

MAX_PRINTED_CHARS = 1000  # of a probe's output kept as evidence when its answer is unusable
MAX_NOTE_CHARS = 500
DEFAULT_PROBE_TIMEOUT = 10.0
# Beyond a probe's timeout: a command probe is killed at its own timeout and answers then.
PROBE_MARGIN_SECONDS = 5.0


@dataclass(frozen=True)
class ProbeReport:
    """What a probe answered, with the evidence it saw."""

    answer: ProbeAnswer
    result: Any = None
    note: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


class Prober(Protocol):
    """A tool's probe: what to record before the call runs, and how to ask afterwards."""

    @property
    def rerun_when_not_applied(self) -> bool: ...

    def prepare(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        """The pre-state the probe will need, recorded in the intent (may be empty)."""
        ...

    def probe(
        self, arguments: dict[str, Any], context: ToolContext, pre_state: dict[str, Any]
    ) -> ProbeReport: ...


def prober_of(tool: object) -> Prober | None:
    """The tool's probe, if it declares one."""
    prober = getattr(tool, "prober", None)
    return prober if prober is not None and hasattr(prober, "probe") else None


def unknown(note: str, **evidence: Any) -> ProbeReport:
    return ProbeReport(ProbeAnswer.UNKNOWN, None, note[:MAX_NOTE_CHARS], evidence)


def parse_answer(exit_code: int | None, stdout: str, stderr: str, timeout: float) -> ProbeReport:
    """A command or Python probe's answer from how it ended and what it printed.

    Only exit code 0 with a JSON object on the last non-empty line of stdout
    counts; everything else is ``unknown`` with the output kept (truncated).
    """
    printed = {"stdout": stdout[-MAX_PRINTED_CHARS:], "stderr": stderr[-MAX_PRINTED_CHARS:]}
    if exit_code is None:
        return unknown(f"the probe timed out after {timeout:g}s", **printed)
    if exit_code != 0:
        return unknown(f"the probe exited with code {exit_code}", exit_code=exit_code, **printed)
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return unknown("the probe printed no JSON answer", **printed)
    return report_from(answer, printed)


def report_from(answer: dict[str, Any], printed: dict[str, Any]) -> ProbeReport:
    """Check an answer object: ``answer`` one of three, ``result`` present for applied."""
    kind = answer.get("answer")
    note = answer.get("note", "")
    note = note[:MAX_NOTE_CHARS] if isinstance(note, str) else json.dumps(note)[:MAX_NOTE_CHARS]
    evidence = answer.get("evidence")
    evidence = dict(evidence) if isinstance(evidence, dict) else {}
    if kind == ProbeAnswer.APPLIED:
        if "result" not in answer:
            return unknown("the probe answered applied without a result", **printed)
        return ProbeReport(ProbeAnswer.APPLIED, answer["result"], note, evidence)
    if kind == ProbeAnswer.NOT_APPLIED:
        return ProbeReport(ProbeAnswer.NOT_APPLIED, None, note, evidence)
    if kind == ProbeAnswer.UNKNOWN:
        return ProbeReport(ProbeAnswer.UNKNOWN, None, note or "the probe cannot tell", evidence)
    return unknown(f"the probe gave no known answer ({str(kind)[:50]!r})", **printed)


def run_probe(
    prober: Prober, arguments: dict[str, Any], context: ToolContext, pre_state: dict[str, Any]
) -> tuple[ProbeReport, float]:
    """Ask the probe; a probe that raises or answers something unusable is ``unknown``."""
    started = time.monotonic()
    bound = _probe_bound(prober)
    try:
        report = _bounded_probe(prober, arguments, context, pre_state, bound)
        if not isinstance(report, ProbeReport):
            report = unknown(f"the probe returned {type(report).__name__}, not a report")
        elif report.answer is ProbeAnswer.APPLIED:
            report = _storable(report)
    except Exception as exc:  # a probe's own failure is an unknown, never a success
        log.warning("probe raised: %s: %s", type(exc).__name__, str(exc)[:200])
        report = unknown(f"the probe failed: {type(exc).__name__}: {str(exc)[:300]}")
    return report, time.monotonic() - started


def _probe_bound(prober: Prober) -> float:
    """How long recovery waits for a probe: its own timeout (a command's) and a margin."""
    own = getattr(prober, "timeout", None)
    seconds = float(own) if isinstance(own, int | float) and own > 0 else DEFAULT_PROBE_TIMEOUT
    return seconds + PROBE_MARGIN_SECONDS


def _bounded_probe(
    prober: Prober,
    arguments: dict[str, Any],
    context: ToolContext,
    pre_state: dict[str, Any],
    seconds: float,
) -> Any:
    """The probe's answer, asked on a thread of its own: a probe stuck in a system call
    (an ``open()`` that blocks) is ``unknown`` at ``seconds`` instead of hanging recovery."""
    ended: list[tuple[bool, Any]] = []

    def ask() -> None:
        try:
            ended.append((True, prober.probe(arguments, context, pre_state)))
        except BaseException as exc:  # raised on the caller's thread below
            ended.append((False, exc))

    thread = threading.Thread(target=ask, name="turnlog-probe", daemon=True)
    thread.start()
    thread.join(seconds)
    if not ended:
        return unknown(f"the probe did not answer within {seconds:g}s")
    answered, value = ended[0]
    if answered:
        return value
    raise value


def _storable(report: ProbeReport) -> ProbeReport:
    try:
        result = json.loads(json.dumps(report.result))
    except (TypeError, ValueError):
        return unknown("the probe's result is not JSON", result=repr(report.result)[:200])
    return ProbeReport(report.answer, result, report.note, report.evidence)


# ------------------------------------------------------------------ who may still act


def owner_identity() -> dict[str, Any]:
    """This process's identity as a call's owner (empty where processes cannot be identified)."""
    me = identify(os.getpid())
    return me.as_dict(0) if me is not None else {}


def still_acting(call: ToolCall) -> str:
    """Why the call's owner or a process of its attempt may still act ('' when none can).

    The owner is recorded in the intent; a process on another host (or
    boot) cannot be checked from here, so it counts as possibly alive.
    """
    if not call.owner:
        return "the intent does not name the process that ran the call"
    records = [call.owner] + [p for p in call.processes if p.get("attempt") == call.attempt]
    for record in records:
        process = ToolProcess(
            int(record["pid"]),
            int(record["process_started_at"]),
            str(record.get("host", "")),
            str(record.get("boot_id", "")),
        )
        if not is_here(process):
            where = process.host or "another host"
            return f"process {process.pid} ran on {where}; it cannot be checked from here"
        if is_alive(process):
            return f"process {process.pid} that ran the call is still alive"
    return ""


# ------------------------------------------------------------------ append_file


@dataclass(frozen=True)
class AppendFileProber:
    """append_file's probe: compare the file with the size and inode recorded before the write.

    The bytes after the recorded size are exactly the line → applied; the
    file still has the recorded size (or is still absent) → not_applied;
    anything else (another file in its place, other bytes) → unknown.
    """

    rerun_when_not_applied: bool = False

    def prepare(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        relative = str(arguments.get("path", ""))
        try:
            state = file_state(context.sandbox, relative)
        except (SandboxPathError, OSError):
            return {}  # the call will be refused; nothing for a probe to compare
        if state is None:
            return {"path": relative, "exists": False, "size": 0}
        return {"path": relative, "exists": True, **state}

    def probe(
        self, arguments: dict[str, Any], context: ToolContext, pre_state: dict[str, Any]
    ) -> ProbeReport:
        if not pre_state or "size" not in pre_state:
            return unknown("nothing was recorded about the file before the call ran")
        relative = str(pre_state["path"])
        text = str(arguments["text"])
        line = (text if text.endswith("\n") else text + "\n").encode("utf-8")
        size = int(pre_state["size"])
        now = file_state(context.sandbox, relative)
        evidence: dict[str, Any] = {"path": relative, "recorded": dict(pre_state), "now": now}
        if now is None:
            if not pre_state.get("exists"):
                return ProbeReport(
                    ProbeAnswer.NOT_APPLIED, None, "the file is still absent", evidence
                )
            return unknown("the file is gone", **evidence)
        if pre_state.get("exists") and (now["inode"], now["device"]) != (
            pre_state.get("inode"),
            pre_state.get("device"),
        ):
            return unknown("another file is in its place (inode changed)", **evidence)
        if now["size"] == size:
            note = "the file still has the size recorded before the call"
            return ProbeReport(ProbeAnswer.NOT_APPLIED, None, note, evidence)
        after = read_at(context.sandbox, relative, size, len(line) + 1) or b""
        evidence["bytes_after"] = (
            len(after) if now["size"] - size > len(line) else now["size"] - size
        )
        if now["size"] - size == len(line) and after == line:
            note = f"the {len(line)} bytes after the recorded size are the line"
            result = {"path": "/".join(path_parts(relative)), "bytes": len(line)}
            return ProbeReport(ProbeAnswer.APPLIED, result, note, evidence)
        return unknown("the file changed, but not by exactly this line", **evidence)


def probe_context(session_id: str, call: ToolCall, sandbox: Path, namespace: str) -> ToolContext:
    """The context a probe runs with: the call's own (same idempotency key, same sandbox)."""
    return ToolContext(session_id, call.call_id, call.attempt, sandbox, namespace=namespace)
