"""Traces of what the agent loop does: a port the interface implements (OpenTelemetry).

A turn is one span, parented to the ``traceparent`` its submitter sent (kept
with the submission, so the worker that runs it, in whatever process, joins
the caller's trace); each model call and each tool call is a span inside it.
The default tracer does nothing and costs a method call; the interface
installs an OpenTelemetry one when the standard ``OTEL_*`` variables ask for
it (``interface.tracing``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol


class Span(Protocol):
    """One span while it is open: attributes may be added, a failure noted."""

    def set(self, attributes: dict[str, Any]) -> None: ...

    def fail(self, reason: str) -> None: ...


class Tracer(Protocol):
    """Opens the spans of a turn, of a model call and of a tool call, on the running thread."""

    def turn(
        self, session_id: str, turn_id: str, traceparent: str
    ) -> AbstractContextManager[Span]: ...

    def model_call(self, provider: str, model: str) -> AbstractContextManager[Span]: ...

    def tool_call(self, tool: str, call_id: str) -> AbstractContextManager[Span]: ...

    def traceparent(self) -> str:
        """The open span as a W3C ``traceparent`` ('' when none): for a tool's process."""
        ...


class _NoSpan:
    def set(self, attributes: dict[str, Any]) -> None:
        return None

    def fail(self, reason: str) -> None:
        return None


NO_SPAN = _NoSpan()


@contextmanager
def _nothing() -> Iterator[Span]:
    yield NO_SPAN


class Untraced:
    """The default tracer: no spans."""

    def turn(self, session_id: str, turn_id: str, traceparent: str) -> AbstractContextManager[Span]:
        return _nothing()

    def model_call(self, provider: str, model: str) -> AbstractContextManager[Span]:
        return _nothing()

    def tool_call(self, tool: str, call_id: str) -> AbstractContextManager[Span]:
        return _nothing()

    def traceparent(self) -> str:
        return ""


def usage_attributes(usage: dict[str, Any]) -> dict[str, Any]:
    """A model reply's token usage as GenAI attributes (what the provider reported of it)."""
    found: dict[str, Any] = {}
    for key, names in (
        ("gen_ai.usage.input_tokens", ("input_tokens", "prompt_tokens")),
        ("gen_ai.usage.output_tokens", ("output_tokens", "completion_tokens")),
    ):
        for name in names:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                found[key] = value
                break
    return found
