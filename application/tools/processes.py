"""OS processes that tools spawn: started behind a gate, recorded, found again, killed.

A command runs as the leader of its own session and process group
(``start_new_session``), so the whole group can be signalled at once, and it
outlives the worker that started it. That is why it is recorded: the worker
reports the new process (``ToolContext.report_process`` → ToolCallProcessStarted)
and only then opens the *gate* that lets the command run. If the worker dies
before the record is committed, the gate reads end-of-file and the command
never runs: no process does work without being on record.

In the sandbox, the gate's pipe goes on as the command's *lifeline* (descriptor
3): the worker keeps its write end open until the command has ended, and the
sandbox's last step refuses to run the command when it reads end-of-file
(application/tools/containment.py says why bwrap needs it).

A pid alone is not an identity, since pids are reused. A recorded process is
"the same" only when the pid, its kernel start time (field 22 of
/proc/<pid>/stat), the host and the boot id all match. Linux only (/proc).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any, cast

from turnlog.application.tools.containment import Containment, Grant
from turnlog.domain.turns import ToolProcess

# The gate: wait for "go" on stdin, then become the command (same pid, same
# start time). EOF — the worker died before recording — exits without running it.
GATE = 'IFS= read -r go && [ "$go" = go ] && exec "$@" </dev/null; exit 125'
# The same, handing the gate's pipe on to the command as its lifeline.
LIFELINE_FD = 3
GATE_AND_LIFELINE = GATE.replace("</dev/null", f"{LIFELINE_FD}<&0 </dev/null")
GATE_NAME = "turnlog-gate"


def unsupported_reason(platform: str | None = None, proc: Path = Path("/proc")) -> str:
    """Why command tools cannot run on this machine ('' when they can).

    Telling a recorded process from a stranger that reused its pid needs the
    kernel start time and boot id that only Linux's /proc gives. Elsewhere
    (macOS, Windows) a recorded process would look gone ("process vanished")
    while it runs, and could not be killed safely, so command tools are
    refused when a process starts rather than misreported later.
    """
    platform = platform or sys.platform
    if platform.startswith("linux") and (proc / "self" / "stat").exists():
        return ""
    return (
        f"command tools (TURNLOG_SHELL_TOOL, TURNLOG_TOOLS_FILE) need Linux with /proc, to"
        f" identify the processes they start; this is {platform}. Leave both unset here (the"
        " built-in tools work everywhere), or run turnlog on Linux, e.g. in its Docker image"
    )


@dataclass(frozen=True)
class CommandResult:
    """How a command ended and what it printed (each stream cut at the limit)."""

    exit_code: int | None  # None when it was killed at the timeout
    stdout: str
    stderr: str
    truncated: bool
    timed_out: bool


@cache
def this_host() -> tuple[str, str]:
    """(hostname, boot id) of the machine this process runs on."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = ""
    return socket.gethostname(), boot_id


def proc_stat(pid: int) -> tuple[int, str] | None:
    """(start time in clock ticks after boot, state letter) of a pid, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[19]), fields[0]  # fields 22 and 3 of the full line


def identify(pid: int) -> ToolProcess | None:
    """The identity of a live pid on this host, as it is recorded."""
    stat = proc_stat(pid)
    if stat is None:
        return None
    host, boot_id = this_host()
    return ToolProcess(pid=pid, started_at=stat[0], host=host, boot_id=boot_id)


def is_here(process: ToolProcess) -> bool:
    """True when the recorded process ran on this host since its last boot."""
    return (process.host, process.boot_id) == this_host()


def is_alive(process: ToolProcess) -> bool:
    """True when the recorded process still runs here: same pid *and* same start time."""
    if not is_here(process):
        return False
    stat = proc_stat(process.pid)
    return stat is not None and stat[0] == process.started_at and stat[1] not in "ZX"


def kill_group(process: ToolProcess) -> bool:
    """SIGKILL the process group the recorded process leads, if it is still that process.

    Returns True when the group was signalled. A pidfd, opened before the start
    time is compared, pins the identity: it refers to the process that was
    checked, so the final liveness probe through it cannot hit a reused pid.
    """
    if not is_here(process):
        return False
    try:
        pidfd = os.pidfd_open(process.pid)
    except OSError:
        return False  # gone
    try:
        if not is_alive(process):
            return False
        signal.pidfd_send_signal(pidfd, 0)  # raises if it died since
        os.killpg(process.pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def run_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    output_limit: int,
    report: Callable[[ToolProcess], None],
    sandboxed: bool = False,
) -> CommandResult:
    """Run ``argv`` (no shell involved) in its own process group, reporting it before it runs.

    ``sandboxed`` (``argv`` is ``Containment.wrap``'s, with ``lifeline=LIFELINE_FD``):
    give it the gate's pipe as its lifeline. bwrap dies with this thread once it
    runs (``--die-with-parent``, set before its child may go on); a worker that
    dies sooner leaves a gate that reads end-of-file, or a sandbox whose command
    reads it on its lifeline: nothing runs. No ``preexec_fn``, which would make
    every spawn a full fork of this process.

    If ``report`` raises, the command never runs and the exception propagates.
    Whatever the command leaves behind in its process group is killed when it
    ends or times out.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        # Output goes to files, not pipes: a background grandchild holding a pipe
        # open cannot keep us waiting, and a flood of output cannot fill memory.
        gate_read, gate_write = os.pipe()
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", GATE_AND_LIFELINE if sandboxed else GATE, GATE_NAME, *argv],
                stdin=gate_read,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )
        except BaseException:
            os.close(gate_write)
            raise
        finally:
            os.close(gate_read)
        timed_out = _open_gate_and_wait(proc, gate_write, timeout, report)
        return CommandResult(
            exit_code=None if timed_out else proc.returncode,
            stdout=_read_limited(out, output_limit),
            stderr=_read_limited(err, output_limit),
            truncated=_size(out) > output_limit or _size(err) > output_limit,
            timed_out=timed_out,
        )


def run_contained(
    containment: Containment,
    argv: Sequence[str],
    *,
    sandbox: Path,
    grant: Grant,
    env: Mapping[str, str],
    timeout: float,
    output_limit: int,
    report: Callable[[ToolProcess], None],
    read_only: Sequence[Path] = (),
    cwd: Path | None = None,
) -> CommandResult:
    """``run_command`` of ``argv`` in ``sandbox`` as ``containment`` says, with its lifeline.

    ``cwd`` defaults to the sandbox (a caller may name it by an open descriptor).
    """
    spawn = containment.wrap(
        argv, sandbox=sandbox, env=env, grant=grant, read_only=read_only, lifeline=LIFELINE_FD
    )
    return run_command(
        spawn.argv,
        cwd=cwd or sandbox,
        env=spawn.env,
        timeout=timeout,
        output_limit=output_limit,
        report=report,
        sandboxed=containment.enabled,
    )


PR_SET_PDEATHSIG = 1


def _libc_prctl() -> Callable[..., int] | None:
    try:
        return cast(Callable[..., int], ctypes.CDLL(None, use_errno=True).prctl)
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()  # resolved here: the child after fork must not load libraries


def die_with(parent: int) -> Callable[[], None]:
    """A preexec function: SIGKILL this child when the thread that spawned it ends."""

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(125)

    return preexec


def _open_gate_and_wait(
    proc: subprocess.Popen[bytes],
    gate_write: int,
    timeout: float,
    report: Callable[[ToolProcess], None],
) -> bool:
    """Report, open the gate, wait; returns True on timeout. Always reaps the process.

    The gate's pipe stays open until then: it is a sandboxed command's lifeline.
    """
    try:
        process = identify(proc.pid)
        if process is None:
            raise OSError(f"process {proc.pid} vanished before it was recorded")
        report(process)
        os.write(gate_write, b"go\n")
        return not _wait_exited(proc, timeout)
    finally:
        # The leader has exited (or must die now) but is not reaped yet, so its pid
        # still names our group: killing the group cannot hit anyone else's.
        _killpg_quietly(proc.pid)
        proc.wait()
        os.close(gate_write)


def _wait_exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until the process exits, without reaping it; False on timeout."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # no pidfd support: reap at once, and accept the tiny pid-reuse window
        try:
            proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(pidfd)


def _killpg_quietly(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _size(handle: IO[Any]) -> int:
    return os.fstat(handle.fileno()).st_size


def _read_limited(handle: IO[bytes], limit: int) -> str:
    handle.seek(0)
    return handle.read(limit).decode("utf-8", errors="replace")
