"""What a tool gets besides its arguments (``ToolContext``), and its calls' idempotency keys.

A module of its own: the tools (``application.tools.port``) and their probes
(``application.tools.probes``) both use it, and the tools use the probes.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from turnlog.domain.turns import ToolProcess

# The UUID namespace of tool calls' idempotency keys (uuid5 over namespace, session, call).
IDEMPOTENCY_KEYS = uuid.UUID("9c3a1c2e-4f1d-5d0b-9a6e-2b7f0e5c8d41")


def idempotency_key(namespace: str, session_id: str, call_id: str) -> str:
    """``uuid5`` of the namespace, session id and call id (a unit separator between them)."""
    return str(uuid.uuid5(IDEMPOTENCY_KEYS, "\x1f".join((namespace, session_id, call_id))))


def _ignore_process(process: ToolProcess) -> None:
    return None


@dataclass(frozen=True)
class ToolContext:
    """What a tool gets besides its arguments."""

    session_id: str
    call_id: str  # the model's id: unique only within the session
    attempt: int
    sandbox: Path
    # A tool that spawns an OS process reports it here right after spawning and
    # before the process does any work; the executor records it durably
    # (ToolCallProcessStarted) so the process can be found after a crash. It
    # raises (LeaseLost) when this process no longer owns the turn.
    report_process: Callable[[ToolProcess], None] = field(
        default=_ignore_process, repr=False, compare=False
    )
    namespace: str = "default"
    # Set when the call must stop now (its turn is cancelled, or a cancel is
    # forced): a tool that waits should wait on it. Process-group tools are
    # also killed; the executor then records the call as stopped, whatever it returns.
    stop: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    # The tool call's span as a W3C traceparent ('' when not traced), for its processes.
    traceparent: str = ""

    def trace_env(self) -> dict[str, str]:
        """``TRACEPARENT`` of the call's span (W3C trace context), when the call is traced."""
        return {"TRACEPARENT": self.traceparent} if self.traceparent else {}

    @property
    def idempotency_key(self) -> str:
        """The call's key for the other side: the same for every attempt of this call,
        different for any other call of any session of any namespace.

        A model's call id is unique only within its session (a provider may give
        the same one in two sessions); the key is a UUID derived from the
        namespace, the session id and the call id.
        """
        return idempotency_key(self.namespace, self.session_id, self.call_id)
