"""What the agent loop reports as it runs: a port the interface implements.

The executor tells an ``Observer`` about each model call and tool call (with
its duration), each claim and each turn that ends; recovery tells it about
interrupted turns; the runtime about turns cancelled and proposed calls
decided. The interface turns these into Prometheus metrics; the
application stays free of any metrics library. Observers are called on the
thread running the turn and must return quickly and never raise.
"""

from __future__ import annotations

from typing import Any, Protocol

from turnlog.domain.turns import DEADLINE_REASON


def cancel_kind(reason: str) -> str:
    """A cancel's reason as a metric label: ``deadline``, or ``operator`` for any other."""
    return "deadline" if reason == DEADLINE_REASON else "operator"


class Observer(Protocol):
    """Receives execution facts as they happen in this process."""

    def turn_claimed(self, claim: int) -> None:
        """A turn was claimed; ``claim`` > 1 means it was taken over from an earlier owner."""

    def model_called(self, provider: str, outcome: str, seconds: float) -> None:
        """A model call ended: ``outcome`` is ``replied`` or ``error``."""

    def tokens_used(self, provider: str, usage: dict[str, Any]) -> None:
        """A model reply's token usage, as its provider reported it."""

    def tool_started(self, tool: str) -> None:
        """A tool call is about to run (its start is recorded)."""

    def tool_called(self, tool: str, outcome: str, seconds: float) -> None:
        """A tool call ended: ``succeeded``, ``failed`` or ``lost`` (ownership lost meanwhile)."""

    def turn_ended(self, outcome: str) -> None:
        """A turn this process ran ended: ``completed``, ``failed`` or ``interrupted``."""

    def turn_cancelled(self, reason: str) -> None:
        """This process recorded a turn cancelled: ``reason`` is ``deadline`` or ``operator``."""

    def call_decided(self, decision: str) -> None:
        """This process recorded an operator's decision on a proposed call: ``approved``
        or ``rejected``."""


class Unobserved:
    """The default observer: ignores everything."""

    def turn_claimed(self, claim: int) -> None:
        return None

    def model_called(self, provider: str, outcome: str, seconds: float) -> None:
        return None

    def tokens_used(self, provider: str, usage: dict[str, Any]) -> None:
        return None

    def tool_started(self, tool: str) -> None:
        return None

    def tool_called(self, tool: str, outcome: str, seconds: float) -> None:
        return None

    def turn_ended(self, outcome: str) -> None:
        return None

    def turn_cancelled(self, reason: str) -> None:
        return None

    def call_decided(self, decision: str) -> None:
        return None
