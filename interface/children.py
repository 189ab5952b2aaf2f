"""``turnlog serve --split``: the worker and the read models in child processes.

One Python process runs one thread of Python at a time, so a ``serve --role
all`` process uses at most one core however many turns it runs at once.
With ``--split`` it serves the API itself and starts two children, the
commands an operator would run by hand: ``turnlog worker`` (with serve's
``--concurrency`` and ``--drain-timeout``) and ``turnlog projections run``.
Each builds its own process (``interface.bootstrap``) and has its own log
follower; they meet only in the database, as separate deployments do.

They live and die with serve:

- serve SIGKILLed: the kernel kills them too (``PR_SET_PDEATHSIG``), so
  nothing of the killed serve goes on working; recovery sees one death.
- serve stopped (SIGTERM, Ctrl-C): the API drains first, then the children
  get SIGTERM and drain the same way (the worker up to ``--drain-timeout``).
- a child exits on its own: serve stops, and exits 1 if that child failed,
  so whatever restarts serve restarts all three.

Linux only: elsewhere nothing would kill the children with serve.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from turnlog.application.settings import Settings
from turnlog.interface.terminal import signal_name

log = logging.getLogger("turnlog.serve")

PR_SET_PDEATHSIG = 1
# Beyond the worker's drain: how long a stopping child may take to exit.
EXIT_GRACE = 10.0


def unsupported_reason(platform: str | None = None) -> str:
    """Why ``--split`` cannot run here ('' when it can)."""
    platform = platform or sys.platform
    if platform.startswith("linux"):
        return ""
    return (
        f"--split needs Linux, where its child processes die with serve; this is {platform}."
        " Run the roles as separate commands instead (serve --role api, turnlog worker,"
        " turnlog projections run)"
    )


def child_env(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the settings the command line may have set (the rest are in it already)."""
    env = dict(base)
    env["TURNLOG_NAMESPACE"] = settings.namespace
    env["TURNLOG_DATA_DIR"] = str(settings.data_dir.resolve())
    if settings.database_url:
        env["TURNLOG_DATABASE_URL"] = settings.database_url
    if settings.tenants_file is not None:
        env["TURNLOG_TENANTS_FILE"] = str(settings.tenants_file.resolve())
    return env


def role_commands(
    concurrency: int, drain_timeout: float, metrics_port: int = 0, metrics_host: str = "127.0.0.1"
) -> dict[str, list[str]]:
    """The children by name: each a ``turnlog`` command line.

    ``metrics_port``: the worker serves ``/metrics`` on it, the projections runner on the next
    port (0: neither does).
    """
    commands = {
        "worker": [
            "worker",
            "--concurrency",
            str(concurrency),
            "--drain-timeout",
            str(drain_timeout),
        ],
        "projections": ["projections", "run"],
    }
    if metrics_port:
        for offset, args in enumerate(commands.values()):
            args += ["--metrics-port", str(metrics_port + offset), "--metrics-host", metrics_host]
    return commands


def _die_with_parent(parent: int) -> Callable[[], None]:
    """For ``preexec_fn``: be killed when ``parent`` dies, even if it died already.

    And lead a process group of its own, so a terminal's Ctrl-C reaches serve
    only, which stops the children after the API (see ``Children.stop``).
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork

    def preexec() -> None:
        os.setpgid(0, 0)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # it died between the fork and the prctl
            os._exit(1)

    return preexec


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]


@dataclass
class Children:
    """serve's child processes, started together, watched, stopped after the API."""

    children: list[Child] = field(default_factory=list)
    failed: str | None = None  # the first child that exited on its own, failing
    _stopping: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(
        cls,
        commands: Mapping[str, Sequence[str]],
        env: Mapping[str, str],
        on_exit: Callable[[], None],
    ) -> Children:
        """Start one ``turnlog`` child per command; ``on_exit`` runs if one exits on its own.

        Call from the main thread: a child dies with the thread that started it.
        """
        started = cls()
        preexec = _die_with_parent(os.getpid())
        for name, args in commands.items():
            proc = subprocess.Popen(
                [sys.executable, "-m", "turnlog", *args],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                preexec_fn=preexec,
            )
            started.children.append(Child(name, proc))
            log.info("started %s (pid %d): turnlog %s", name, proc.pid, " ".join(args))
        for child in started.children:  # no thread of this module runs while it forks
            threading.Thread(
                target=started._watch,
                args=(child, on_exit),
                name=f"watch-{child.name}",
                daemon=True,
            ).start()
        return started

    def _watch(self, child: Child, on_exit: Callable[[], None]) -> None:
        code = child.proc.wait()
        if self._stopping.is_set():
            return
        if code != 0 and self.failed is None:
            self.failed = child.name
        how = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
        log.error("%s (pid %d) %s: stopping", child.name, child.proc.pid, how)
        on_exit()

    def stop(self, drain_timeout: float) -> None:
        """SIGTERM each child, wait for them to drain, SIGKILL what is left."""
        self._stopping.set()
        for child in self.children:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.proc.wait(drain_timeout + EXIT_GRACE)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) did not stop: killing it", child.name, child.proc.pid)
                child.proc.kill()
                child.proc.wait()
