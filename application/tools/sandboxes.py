"""Sandboxes: each session's tool directory on this host, and the processes left behind in it.

``gc`` frees what is certainly no longer needed, and nothing else:

- a recorded tool process (ToolCallProcessStarted) is killed — its whole
  process group — only when its pid *and* kernel start time still match the
  record (a reused pid is never signalled) and its attempt is over: the call
  is settled (succeeded, failed, resolved, abandoned) or was re-run under a
  later attempt. A call still ``started`` may be running under a live owner
  or be about to be recovered; a call whose outcome is ``unknown`` belongs to
  an interrupted turn, whose process is evidence an operator may need and
  whose work may still be finishing: both are left alone until the turn is
  abandoned or the call resolved;
- a recorded MCP server (a record naming its ``server``) serves every call
  of its worker and outlives each: while its parent still runs, it is the
  worker's, not the session's, and gc leaves it out unless its call is in
  flight or unknown (then as above). One whose parent is gone is orphaned and
  killed (it should have died with its worker);
- a sandbox is removed only when its session is closed (so no turn is open,
  none interrupted) and none of its recorded processes is still alive, or
  when its session was purged (on another host: a purge clears its own).

Directories that name no session of this namespace are reported, never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from turnlog.application.errors import SessionNotFound, SessionPurged
from turnlog.application.sessions import Sessions
from turnlog.application.tools.processes import is_alive, kill_group
from turnlog.domain.session import Session
from turnlog.domain.turns import CallState, ToolCall, ToolProcess

NO_SESSION = "no such session"
PURGED = "purged"  # its events are gone: a sandbox left on another host than the purge's


@dataclass(frozen=True)
class LiveProcess:
    """A recorded tool process that still runs on this host, and what gc may do with it."""

    call_id: str
    tool: str
    attempt: int
    call_state: str
    process: ToolProcess
    orphaned: bool  # its attempt is over: gc kills it
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "attempt": self.attempt,
            "call_state": self.call_state,
            "pid": self.process.pid,
            "process_started_at": self.process.started_at,
            "orphaned": self.orphaned,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Sandbox:
    """One session's sandbox directory as it is now."""

    session_id: str
    path: Path
    size_bytes: int
    status: str  # the session's status (idle, busy, blocked, closed) or "no such session"
    processes: list[LiveProcess] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "path": str(self.path),
            "size_bytes": self.size_bytes,
            "status": self.status,
            "processes": [p.as_dict() for p in self.processes],
        }


@dataclass(frozen=True)
class Action:
    """One thing gc did, would do (dry run) or deliberately left alone."""

    session_id: str
    action: str  # killed, would kill, kept, removed, would remove, left
    target: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {
            "session_id": self.session_id,
            "action": self.action,
            "target": self.target,
            "reason": self.reason,
        }


class Sandboxes:
    """The sandboxes under this namespace's sandbox root on this host."""

    def __init__(self, sessions: Sessions, root: Path) -> None:
        self.sessions = sessions
        self.root = root

    def scan(self) -> list[Sandbox]:
        """Every sandbox directory: size, its session's status, its live recorded processes."""
        if not self.root.is_dir():
            return []
        entries = sorted(p for p in self.root.iterdir() if p.is_dir() and not p.is_symlink())
        return [self._inspect(path) for path in entries]

    def gc(self, dry_run: bool = False) -> list[Action]:
        """Kill orphaned process groups, remove sandboxes of closed sessions (see module doc)."""
        actions: list[Action] = []
        for sandbox in self.scan():
            actions.extend(self._collect(sandbox, dry_run))
        return actions

    # ---------------------------------------------------------------- parts

    def _inspect(self, path: Path) -> Sandbox:
        try:
            session = self._session(path.name)
        except SessionPurged:
            return Sandbox(path.name, path, _size(path), PURGED)
        size = _size(path)
        if session is None:
            return Sandbox(path.name, path, size, NO_SESSION)
        return Sandbox(path.name, path, size, session.status, live_processes(session))

    def _session(self, name: str) -> Session | None:
        try:
            # Every call's processes, finished turns' too: the full record.
            return self.sessions.get_record(UUID(name))
        except (ValueError, SessionNotFound):
            return None

    def _collect(self, sandbox: Sandbox, dry_run: bool) -> list[Action]:
        sid = sandbox.session_id
        if sandbox.status == NO_SESSION:
            return [Action(sid, "left", str(sandbox.path), "names no session of this namespace")]
        actions, survivors = [], 0
        for live in sandbox.processes:
            target = f"process group {live.process.pid} ({live.tool} call {live.call_id})"
            if not live.orphaned:
                actions.append(Action(sid, "kept", target, live.reason))
                survivors += 1
            elif dry_run:
                actions.append(Action(sid, "would kill", target, live.reason))
            elif kill_group(live.process):
                actions.append(Action(sid, "killed", target, live.reason))
            # else: it ended on its own between the listing and the kill.
        if sandbox.status in ("closed", PURGED) and not survivors:
            verb = "would remove" if dry_run else "removed"
            reason = f"the session is {sandbox.status}"
            if not dry_run:
                try:
                    _remove(self.root, sandbox.path.name)
                except OSError as exc:  # e.g. a link put in the sandbox's place
                    verb, reason = "left", f"not removed safely: {exc.strerror or exc}"
            actions.append(Action(sid, verb, str(sandbox.path), reason))
        return actions


def live_processes(session: Session) -> list[LiveProcess]:
    """The session's recorded tool processes that still run here (pid and start time match)."""
    found = []
    for call in session.calls.values():
        for record in call.processes:
            process = ToolProcess(
                pid=int(record["pid"]),
                started_at=int(record["process_started_at"]),
                host=str(record.get("host", "")),
                boot_id=str(record.get("boot_id", "")),
                server=str(record.get("server", "")),
            )
            if is_alive(process):
                attempt = int(record["attempt"])
                orphaned, reason = _verdict(call, attempt)
                if process.server and orphaned:
                    parent = _parent(process.pid)
                    if parent > 1:
                        continue  # held by its worker: not this session's to collect
                    reason = f"MCP server {process.server!r} outlived its worker"
                found.append(
                    LiveProcess(
                        call.call_id, call.name, attempt, str(call.state), process, orphaned, reason
                    )
                )
    return found


def _verdict(call: ToolCall, attempt: int) -> tuple[bool, str]:
    """(orphaned, why): may the process of this attempt of the call be killed?"""
    if call.state is CallState.UNKNOWN:
        return False, "outcome unknown: abandon the turn or resolve the call first"
    if call.state is CallState.STARTED and call.attempt == attempt:
        return False, "call in flight: its owner may be running it, or recovery will decide"
    if call.attempt > attempt:
        return True, f"attempt {attempt} was superseded by attempt {call.attempt}"
    return True, f"the call is {call.state}; its process outlived it"


def _parent(pid: int) -> int:
    """The pid's parent now (0 when it is gone); 1 once it was orphaned."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return 0
    return int(raw[raw.rindex(")") + 2 :].split()[1])


def _size(path: Path) -> int:
    """Bytes of the files under ``path``, never following a link (not even ``path`` itself)."""
    total = 0
    try:
        root = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        walk = os.fwalk(path.name, dir_fd=root, follow_symlinks=False)
        for _, _, files, directory in walk:
            for name in files:
                with contextlib.suppress(OSError):  # removed while we walked
                    total += os.stat(name, dir_fd=directory, follow_symlinks=False).st_size
    finally:
        os.close(root)
    return total


def _remove(root: Path, name: str) -> None:
    """Remove the sandbox ``name`` under ``root`` relative to root's descriptor.

    ``shutil.rmtree`` with ``dir_fd`` opens each directory relative to its
    parent and refuses a link in the sandbox's own place, so a sandbox swapped
    for a link meanwhile removes nothing outside.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        shutil.rmtree(name, dir_fd=fd)
    finally:
        os.close(fd)
