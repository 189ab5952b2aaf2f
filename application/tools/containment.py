"""Containment: every process a tool starts runs in an OS sandbox (bubblewrap).

``Containment.wrap(argv, sandbox=…, env=…, grant=…)`` turns the command a
tool would run into the argv and environment to spawn instead; nothing else
about spawning changes (the gate, the pid record, the process-group kill of
application/tools/processes.py all see one more exec in the same process).
``check_host()`` says whether this host can do it, and why not.

What a wrapped process gets (docs/containment.md says why each):

- new mount, pid, ipc, uts and network namespaces (``bwrap``); a fresh /proc
  of its own pid namespace, a minimal /dev;
- read-only /usr (and the /bin, /lib… links or dirs) and /etc; the paths the
  tool needs read-only (a Python tool's interpreter, its modules); the
  session's sandbox, bound at its own path, is the only writable place. The
  root, /tmp and the directory above the sandbox are empty and read-only, so
  no other session's sandbox (nor the data directory) is visible;
- never root: when turnlog runs as root, bwrap keeps the host's user
  namespace and the command drops to an unprivileged uid of its session
  (``setpriv``: every capability and every supplementary group gone), the
  sandbox directory being handed to that uid; otherwise bwrap maps the
  server's own unprivileged uid into a user namespace that cannot make more;
- no network unless the tool is granted it: a granted tool shares the
  host's network namespace (every address the host reaches, loopback too);
- only the environment the caller passes (the tools pass a minimal one);
- limits (``ulimit`` of the ``bash`` that starts the command, inside, after
  the namespaces exist): CPU seconds, address space, processes, file size,
  open files, each soft and hard;
- no new privileges (bwrap sets PR_SET_NO_NEW_PRIVS) and death with its
  parent (``--die-with-parent``; the pid namespace dies with its first process);
- a *lifeline* (``lifeline=FD``): the read end of a pipe whose write end only
  the spawning process holds. bwrap sets ``--die-with-parent`` in its child
  after cloning it; a parent killed in between leaves that child running with
  no parent to die with. That ``bash``, the last step before the command
  itself, refuses to run it (exit 125) when the pipe reads end-of-file: the
  spawner is gone, so nothing is left to record or stop it.

``TURNLOG_SANDBOX=off`` (``Containment(enabled=False)``) runs commands as
they are, and says so everywhere; it is never the default.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
# System directories bound read-only. On a merged-/usr system /bin, /lib... are links into
# /usr and are re-created as the same links; where they are directories they are bound.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# Session uids when turnlog runs as root: BASE + crc32(session) % SPAN, one per session, so
# a session's files and its process limit are its own. No account is expected there.
UID_BASE = 1_000_000_000
UID_SPAN = 1_000_000


class ContainmentError(ValueError):
    """A sandbox option that cannot be honoured (bad limit, unknown option)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one tool process (and of what it starts), set with setrlimit."""

    cpu_seconds: int = 300
    address_space_mb: int = 4096
    processes: int = 256
    file_size_mb: int = 1024
    open_files: int = 1024

    OPTIONS = ("cpu_seconds", "address_space_mb", "processes", "file_size_mb", "open_files")

    def __post_init__(self) -> None:
        for name in self.OPTIONS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ContainmentError(
                    f"{name} must be a whole number of at least 1, not {value!r}"
                )

    def ulimit_args(self) -> str:
        """The limits as ``ulimit`` options of a POSIX-mode bash (file size in 512-byte blocks)."""
        return (
            f"-t {self.cpu_seconds} -v {self.address_space_mb * 1024} -u {self.processes}"
            f" -f {self.file_size_mb * 2048} -n {self.open_files}"
        )

    def updated(self, options: Mapping[str, Any]) -> Limits:
        """These limits with some replaced; an unknown option or a bad value is refused."""
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise ContainmentError(
                f"unknown sandbox options {unknown}; allowed: {sorted((*self.OPTIONS, 'network'))}"
            )
        return replace(self, **dict(options))


@dataclass(frozen=True)
class Grant:
    """What one tool may have in its sandbox: its limits, and whether it reaches the network."""

    limits: Limits = field(default_factory=Limits)
    network: bool = False


def parse_grant(options: Any, defaults: Limits) -> Grant:
    """A tool's ``sandbox`` table of the tools file as a Grant (ContainmentError if bad)."""
    if options is None:
        return Grant(defaults)
    if not isinstance(options, dict):
        raise ContainmentError("sandbox must be a table of options")
    options = dict(options)
    network = options.pop("network", False)
    if not isinstance(network, bool):
        raise ContainmentError("sandbox network must be true or false")
    return Grant(defaults.updated(options), network)


@dataclass(frozen=True)
class Spawn:
    """What to start instead of the tool's own argv."""

    argv: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class Containment:
    """How tool processes are started on this host: sandboxed (the default) or not at all."""

    enabled: bool = True
    uid_base: int = UID_BASE
    bwrap: str = "bwrap"

    def wrap(
        self,
        argv: Sequence[str],
        *,
        sandbox: Path,
        env: Mapping[str, str],
        grant: Grant | None = None,
        read_only: Sequence[Path] = (),
        lifeline: int | None = None,
    ) -> Spawn:
        """The argv and environment that run ``argv`` inside the session's sandbox.

        ``sandbox`` is the session's directory (it must exist); ``read_only``
        are further host paths the process may read (bound at the same path).
        ``lifeline``: the descriptor the process will have open on the read end
        of a pipe the spawner keeps open while it lives (see the module's text).
        As root, the sandbox directory is handed to the session's uid here.
        """
        if not self.enabled:
            return Spawn(list(argv), dict(env))
        grant = grant or Grant()
        sandbox = Path(os.path.abspath(sandbox))
        mounts = Mounts(sandbox)
        for path in [*read_only, *_program_paths(argv[0] if argv else "")]:
            mounts.read_only(Path(os.path.abspath(path)))
        args = [self.bwrap, *mounts.args(), *_namespaces(grant.network)]
        args += ["--die-with-parent", "--chdir", str(sandbox), "--"]
        inner = [*_starter(grant.limits, lifeline), *argv]
        if os.geteuid() == 0:
            uid = self.session_uid(sandbox.name)
            _hand_over(sandbox, uid)
            inner = [
                _program("setpriv"),
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
                *inner,
            ]
        else:
            # The caller's own uid inside a user namespace that can create no further one.
            args[1:1] = ["--unshare-user", "--disable-userns"]
        environment = dict(env) | {"HOME": str(sandbox), "TMPDIR": str(sandbox)}
        return Spawn([*args, *inner], environment)

    def session_uid(self, session: str) -> int:
        """The unprivileged uid a session's tools run as when turnlog runs as root."""
        return self.uid_base + zlib.crc32(session.encode("utf-8")) % UID_SPAN


@functools.cache
def _program(name: str) -> str:
    """The absolute path of a helper (found where the sandbox binds /usr), or its bare name."""
    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin") or name


def _starter(limits: Limits, lifeline: int | None) -> list[str]:
    """A bash that sets the limits, checks the lifeline, then becomes the command.

    ``read -t 0`` succeeds when input is there without reading it, end-of-file
    included; the spawner never writes to the pipe, so success means it is
    gone. The lifeline is closed for the command. POSIX mode reads no
    ``BASH_ENV``. Exit 125: the command was not run.
    """
    script = f"ulimit {limits.ulimit_args()} || exit 125; "
    if lifeline is not None:
        if not 2 < lifeline < 1024:
            raise ValueError(f"a lifeline is a descriptor above 2, not {lifeline!r}")
        script += f"read -t 0 -u {lifeline} && exit 125; exec {lifeline}<&- "
    else:
        script += "exec "
    return [_program("bash"), "--posix", "-c", script + '"$@"', "turnlog-sandbox"]


def _namespaces(network: bool) -> list[str]:
    args = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--hostname", "sandbox"]
    return args if network else [*args, "--unshare-net"]


def _program_paths(program: str) -> list[Path]:
    """An absolute program outside the system dirs is visible read-only: the program
    itself, or the whole virtual environment whose ``bin`` holds it."""
    if not os.path.isabs(program):
        return []
    path = Path(program)
    config = path.parent.parent / "pyvenv.cfg"
    if config.is_file():  # the environment, and the installation its interpreter links to
        home = [
            Path(line.split("=", 1)[1].strip()).parent
            for line in config.read_text(errors="replace").splitlines()
            if line.split("=", 1)[0].strip() == "home" and "=" in line
        ]
        return [path.parent.parent, *home]
    real = path.resolve()
    return [path] if real == path else [path, real.parent.parent]


def _hand_over(sandbox: Path, uid: int) -> None:
    """Make the session's uid own its sandbox directory (itself, not what is in it)."""
    info = os.lstat(sandbox)
    if (info.st_uid, info.st_gid) != (uid, uid):
        os.chown(sandbox, uid, uid, follow_symlinks=False)


class Mounts:
    """bwrap's file-system arguments: system dirs, read-only paths, the sandbox, nothing else."""

    def __init__(self, sandbox: Path) -> None:
        self.sandbox = sandbox
        self.extra: list[Path] = []

    def read_only(self, path: Path) -> None:
        if path.exists() and not _under(path, self._system()) and path not in self.extra:
            self.extra.append(path)

    @staticmethod
    @functools.cache
    def _system() -> tuple[Path, ...]:
        return tuple(Path(p) for p in SYSTEM_DIRS if os.path.isdir(p) and not os.path.islink(p))

    def args(self) -> list[str]:
        args: list[str] = []
        for name in SYSTEM_DIRS:
            if os.path.islink(name):
                args += ["--symlink", os.readlink(name), name]
            elif os.path.isdir(name):
                args += ["--ro-bind", name, name]
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "0755", "--dir", "/tmp"]  # noqa: S108
        made: set[Path] = set()
        bound: list[Path] = list(self._system())
        for path in sorted(self.extra, key=lambda p: len(p.parts)):
            if _under(path, bound):
                continue
            args += self._parents(path, bound, [], made)
            args += ["--ro-bind", str(path), str(path)]
            bound.append(path)
        # The directories above the sandbox hold other sessions' sandboxes and the data
        # directory: where a read-only path shows them, an empty tmpfs covers them.
        masks = [self.sandbox.parent]
        if self.sandbox.parent.parent.name == "sandboxes":
            masks.insert(0, self.sandbox.parent.parent.parent)
        covered = [m for m in masks if _under(m, bound)][:1]
        for mask in covered:
            args += ["--perms", "0755", "--tmpfs", str(mask)]
            made.add(mask)
        args += self._parents(self.sandbox, bound, covered, made)
        args += ["--bind", str(self.sandbox), str(self.sandbox), "--remount-ro", "/"]
        for mask in covered:
            args += ["--remount-ro", str(mask)]
        return args

    @staticmethod
    def _parents(path: Path, bound: list[Path], masks: list[Path], made: set[Path]) -> list[str]:
        """``--dir`` for each parent not there yet (mode 0755, whatever the host's modes)."""
        args: list[str] = []
        for parent in reversed(path.parents):
            if parent == Path("/") or parent in made:
                continue
            in_mask = any(mask in parent.parents for mask in masks)
            if not in_mask and _under(parent, bound):
                continue  # there already, in a read-only bind
            args += ["--perms", "0755", "--dir", str(parent)]
            made.add(parent)
        return args


def _under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


# ------------------------------------------------------------------ the host


@dataclass(frozen=True)
class HostCheck:
    """Whether tool processes can be sandboxed here, and what the sandbox was seen to do."""

    ok: bool
    reason: str  # '' when ok
    mode: str  # "root: a uid per session" or "user namespace", or '' when not ok
    facts: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "mode": self.mode, "facts": self.facts}


# What the trial prints about itself from inside (one "key value" a line).
_TRIAL = r"""
echo "uid $(id -u)"
echo "capabilities $(grep CapEff /proc/self/status | cut -f2)"
echo "no_new_privs $(grep NoNewPrivs /proc/self/status | cut -f2)"
echo "pid_1 $(cat /proc/1/comm)"
echo "interfaces $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"
touch /usr/.w 2>/dev/null && echo "system_writable yes" || echo "system_writable no"
touch "$HOME/.w" 2>/dev/null && rm -f "$HOME/.w" && echo "sandbox_writable yes" \
  || echo "sandbox_writable no"
echo "others_visible $(ls "$(dirname "$HOME")" | grep -vc "^$(basename "$HOME")$")"
echo "processes_limit $(awk '/Max processes/ {print $3}' /proc/self/limits)"
"""


def check_host(containment: Containment = Containment()) -> HostCheck:
    """Try the sandbox once here: bwrap, setpriv and bash found, and a trial command run."""
    if not containment.enabled:
        return HostCheck(False, "the sandbox is off (TURNLOG_SANDBOX=off)", "")
    return _check_host(containment)


@functools.cache
def _check_host(containment: Containment) -> HostCheck:
    helpers = (containment.bwrap, "setpriv", "bash")
    missing = [p for p in helpers if shutil.which(p) is None]
    if os.geteuid() != 0 and "setpriv" in missing:
        missing.remove("setpriv")
    if missing:
        return HostCheck(
            False,
            f"{', '.join(missing)} not found: install bubblewrap, util-linux and bash"
            " (Debian: apt-get install bubblewrap)",
            "",
        )
    with tempfile.TemporaryDirectory(prefix="turnlog-sandbox-check-") as top:
        sandbox = Path(top) / "sandboxes" / "check" / "trial"
        sandbox.mkdir(parents=True)
        (sandbox.parent / "other").mkdir()
        lifeline, held = os.pipe()
        spawn = containment.wrap(
            ["/bin/sh", "-c", _TRIAL],
            sandbox=sandbox,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            grant=Grant(Limits(cpu_seconds=5, processes=64)),
            lifeline=lifeline,
        )
        try:
            done = subprocess.run(
                spawn.argv,
                env=spawn.env,
                capture_output=True,
                timeout=20,
                check=False,
                pass_fds=(lifeline,),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return HostCheck(False, f"the sandbox did not start: {exc}", "")
        finally:
            os.close(lifeline)
            os.close(held)
    stderr = done.stderr.decode(errors="replace").strip()
    if done.returncode != 0:
        why = stderr.splitlines()[-1] if stderr else f"exit code {done.returncode}"
        return HostCheck(
            False,
            f"bwrap cannot make a sandbox here ({why}); user namespaces may be off"
            " (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone)",
            "",
        )
    facts = dict(
        line.split(" ", 1)
        for line in done.stdout.decode(errors="replace").splitlines()
        if " " in line
    )
    facts = {k: v.strip() for k, v in facts.items()}
    mode = "root: a uid per session" if os.geteuid() == 0 else "user namespace"
    if facts.get("uid") == "0" or facts.get("system_writable") != "no":
        return HostCheck(False, f"the trial sandbox was not contained: {facts}", "", facts)
    return HostCheck(True, "", mode, facts)


# ------------------------------------------------------------------ the tools file


@dataclass(frozen=True)
class SandboxOptions:
    """The tools file's ``[sandbox]`` table: default limits, and options per tool by name."""

    defaults: Limits = field(default_factory=Limits)
    per_tool: dict[str, Grant] = field(default_factory=dict)

    def grant(self, name: str, inline: Any = None) -> Grant:
        """A tool's grant: its own ``sandbox`` table, or ``[sandbox.tools.NAME]``, or defaults."""
        if inline is not None:
            if name in self.per_tool:
                raise ContainmentError(
                    f"sandbox options given twice (its own sandbox and [sandbox.tools.{name}])"
                )
            return parse_grant(inline, self.defaults)
        return self.per_tool.get(name, Grant(self.defaults))


def sandbox_options(data: Any) -> SandboxOptions:
    """Parse ``[sandbox]`` of a tools file (``{}`` when absent); ContainmentError if bad."""
    table = data.get("sandbox") if isinstance(data, dict) else None
    if table is None:
        return SandboxOptions()
    if not isinstance(table, dict):
        raise ContainmentError("[sandbox] must be a table")
    table = dict(table)
    tools = table.pop("tools", {})
    if "network" in table:
        raise ContainmentError(
            "[sandbox]: network is granted to one tool at a time ([sandbox.tools.NAME]"
            " or the tool's own sandbox table), never to every tool"
        )
    try:
        defaults = Limits().updated(table)
    except ContainmentError as exc:
        raise ContainmentError(f"[sandbox]: {exc}") from None
    if not isinstance(tools, dict):
        raise ContainmentError("[sandbox.tools] must be a table of tables, one per tool")
    per_tool: dict[str, Grant] = {}
    for name, options in tools.items():
        try:
            per_tool[name] = parse_grant(options, defaults)
        except ContainmentError as exc:
            raise ContainmentError(f"[sandbox.tools.{name}]: tool {name!r}: {exc}") from None
    return SandboxOptions(defaults, per_tool)
