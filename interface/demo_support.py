"""The restart demo's parts: its receipt, its load-stretched waits, its server process.

``turnlog demo restart`` records each step in a ``Receipt`` and runs real
``turnlog serve`` subprocesses through ``Server``; every wait is stretched by
how busy the machine is, so a busy machine makes the demo slower, not wrong.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from turnlog.application.settings import Settings


class DemoFailed(Exception):
    """A step's verdict was false; the receipt says which."""


@dataclass
class Step:
    name: str
    ok: bool
    detail: str
    seconds: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Receipt:
    namespace: str
    started_at: float
    steps: list[Step] = field(default_factory=list)
    ok: bool = False

    def as_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def slowness() -> float:
    """Runnable processes per CPU over the last one or five minutes, the larger (at least 1)."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:  # pragma: no cover - no load average on this platform
        return 1.0
    cpus = os.cpu_count() or 1
    return max(1.0, one / cpus, five / cpus)


def scaled(seconds: float) -> float:
    """``seconds`` stretched by how busy the machine is now."""
    return seconds * slowness()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One ``turnlog serve`` subprocess on a loopback port."""

    def __init__(self, settings: Settings, port: int, log_path: Path, **extra_env: str) -> None:
        self.port = port
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNLOG_")}
        env.update(
            TURNLOG_NAMESPACE=settings.namespace,
            TURNLOG_DATA_DIR=str(settings.data_dir.resolve()),
            **{"TURNLOG_PROBES": "off", **extra_env},  # probes on in the last part only
        )
        if settings.database_url:
            env["TURNLOG_DATABASE_URL"] = settings.database_url
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", "serve", "--port", str(port)],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, deadline: float = 60.0) -> float:
        start = time.monotonic()
        while time.monotonic() - start < scaled(deadline):
            if self.proc.poll() is not None:
                raise DemoFailed(f"server exited with {self.proc.returncode} before it was ready")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise DemoFailed(f"server not ready within {scaled(deadline):.0f}s")

    def kill(self, sig: int = signal.SIGKILL) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=scaled(60))
        self._log.close()
        return code
