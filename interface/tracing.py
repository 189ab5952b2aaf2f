"""OpenTelemetry traces of turns, model calls and tool calls (the optional ``otel`` extra).

Off unless the standard variables ask for it: ``OTEL_TRACES_EXPORTER``
(``otlp``, ``console`` or ``none``) or an ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SDK_DISABLED=true`` turns it off
whatever else is set. The exporters read their own ``OTEL_EXPORTER_OTLP_*``
variables and the resource reads ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (default service name: ``turnlog``). Spans follow
the OpenTelemetry GenAI semantic conventions:

- ``invoke_agent turnlog`` for a turn, parented to the submitter's
  ``traceparent`` (``gen_ai.conversation.id``: the session);
- ``chat {model}`` for a model call (``gen_ai.provider.name``,
  ``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` / ``output_tokens``);
- ``execute_tool {tool}`` for a tool call (``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``), whose process gets ``TRACEPARENT``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from turnlog.application.errors import ConfigurationError
from turnlog.application.tracing import Span, Tracer, Untraced

SYSTEM = "turnlog"
# W3C trace context: version-trace id-parent id-flags, lowercase hex.
TRACEPARENT = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
)


def trace_context(header: str | None) -> str:
    """A request's ``traceparent`` as kept with its turn; '' when absent or malformed.

    A malformed one is ignored, as the W3C recommendation says, never refused:
    a caller's tracing must not stop its turns.
    """
    value = (header or "").strip()
    return value if TRACEPARENT.fullmatch(value) else ""


def tracing_asked(env: Mapping[str, str]) -> bool:
    """Whether the standard variables ask for traces."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def build_tracer(env: Mapping[str, str] | None = None) -> Tracer:
    """The process's tracer: OpenTelemetry's when asked for, else one that does nothing."""
    env = os.environ if env is None else env
    if not tracing_asked(env):
        return Untraced()
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigurationError(
            "OTEL_* variables ask for traces, but OpenTelemetry's SDK is not installed:"
            " pip install 'turnlog[otel]'"
        ) from None
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or SYSTEM})
    provider = TracerProvider(resource=resource)
    for name in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(","):
        provider.add_span_processor(BatchSpanProcessor(_exporter(name.strip().lower())))
    return OtelTracer(provider)


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigurationError(
                "OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter: pip install 'turnlog[otel]'"
            ) from None
        return OTLPSpanExporter()
    raise ConfigurationError(f"OTEL_TRACES_EXPORTER={name!r}: turnlog knows otlp, console, none")


class _OtelSpan:
    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, attributes: dict[str, Any]) -> None:
        self._span.set_attributes(attributes)

    def fail(self, reason: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute("error.type", reason[:100])
        self._span.set_status(Status(StatusCode.ERROR, reason))


class OtelTracer:
    """A ``Tracer`` on an OpenTelemetry tracer provider (the SDK's, or one a test gives)."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._tracer = provider.get_tracer("turnlog")
        self._propagator = TraceContextTextMapPropagator()

    def turn(self, session_id: str, turn_id: str, traceparent: str) -> AbstractContextManager[Span]:
        parent = self._propagator.extract({"traceparent": traceparent}) if traceparent else None
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": SYSTEM,
            "gen_ai.conversation.id": session_id,
            "turnlog.turn.id": turn_id,
        }
        return self._span(f"invoke_agent {SYSTEM}", attributes, parent, kind="INTERNAL")

    def model_call(self, provider: str, model: str) -> AbstractContextManager[Span]:
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
        }
        return self._span(f"chat {model}".strip(), attributes, None, kind="CLIENT")

    def tool_call(self, tool: str, call_id: str) -> AbstractContextManager[Span]:
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
        }
        return self._span(f"execute_tool {tool}", attributes, None, kind="INTERNAL")

    def traceparent(self) -> str:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier.get("traceparent", "")

    @contextmanager
    def _span(
        self, name: str, attributes: dict[str, Any], parent: Any, kind: str
    ) -> Iterator[Span]:
        from opentelemetry.trace import SpanKind

        with self._tracer.start_as_current_span(
            name, context=parent, kind=SpanKind[kind], attributes=attributes
        ) as span:
            yield _OtelSpan(span)
