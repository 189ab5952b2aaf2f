"""Traces: a span per turn, per model call and per tool call, parented to the submitter's trace.

An in-memory exporter (OpenTelemetry's own) sees what an OTLP collector would:
the names, the GenAI attributes and the parents of one turn with one tool call.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tests.api.conftest import api, new_session  # noqa: F401  (a fixture)
from turnlog.application.runtime import Runtime
from turnlog.application.tools.command import command_env
from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.port import FunctionTool, ToolSpec
from turnlog.application.tracing import Untraced
from turnlog.domain.turns import Effect
from turnlog.interface.metrics import ExecutionMetrics
from turnlog.interface.tracing import OtelTracer, build_tracer, trace_context, tracing_asked

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"


@pytest.fixture
def spans(runtime: Runtime) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runtime.executor.tracer = OtelTracer(provider)
    return exporter


def test_a_turn_with_one_tool_call_is_three_kinds_of_span_in_the_submitter_s_trace(
    runtime: Runtime, spans: InMemorySpanExporter
) -> None:
    seen: list[str] = []

    def probe(arguments: dict[str, Any], context: ToolContext) -> str:
        seen.append(context.traceparent)
        return "looked"

    spec = ToolSpec("look", "looks", {"type": "object", "properties": {}}, Effect.READ_ONLY)
    runtime.executor.tools.add(FunctionTool(spec, probe))
    session = runtime.sessions.create_session(title="traced", tools=["look"], tools_chosen=True)
    submitted = runtime.sessions.submit_turn(
        session.session_id, "/tool look {}", traceparent=TRACEPARENT
    )
    turn = runtime.executor.run_turn(session.session_id, submitted.turn_id)
    assert turn.state == "completed"

    finished = {s.name: s for s in spans.get_finished_spans()}
    names = [s.name for s in spans.get_finished_spans()]
    chats = [n for n in names if n.split(" ")[0] == "chat"]
    assert len(chats) == 2  # the reply asking for the tool, then the final reply
    assert sorted(set(names) - set(chats)) == ["execute_tool look", "invoke_agent turnlog"]
    assert len(names) == 4
    agent, tool = finished["invoke_agent turnlog"], finished["execute_tool look"]
    # The turn joins the submitter's trace, under the span it named.
    assert format(agent.context.trace_id, "032x") == TRACE
    assert agent.parent is not None and format(agent.parent.span_id, "016x") == PARENT
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.conversation.id"] == str(session.session_id)
    assert agent.attributes["turnlog.turn.state"] == "completed"
    for span in spans.get_finished_spans():
        if span is not agent:
            assert span.parent is not None and span.parent.span_id == agent.context.span_id
            assert span.context.trace_id == agent.context.trace_id
    chat = next(s for s in spans.get_finished_spans() if s.name.startswith("chat"))
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.provider.name"] == "fixture"
    assert tool.attributes["gen_ai.tool.name"] == "look"
    assert tool.attributes["gen_ai.tool.call.id"]
    # The tool was told its own span, as its processes are (TRACEPARENT).
    assert seen == [f"00-{TRACE}-{format(tool.context.span_id, '016x')}-01"]


def test_a_tool_process_gets_traceparent_only_when_the_call_is_traced(tmp_path: Any) -> None:
    context = ToolContext("s", "c", 1, tmp_path, traceparent=TRACEPARENT)
    assert command_env(context)["TRACEPARENT"] == TRACEPARENT
    untraced = ToolContext("s", "c", 1, tmp_path)
    assert "TRACEPARENT" not in command_env(untraced)


def test_the_http_traceparent_is_kept_with_the_turn_and_a_malformed_one_is_ignored(
    api: TestClient,  # noqa: F811
    runtime: Runtime,
) -> None:
    sid = new_session(api)
    kept = api.post(
        f"/v1/sessions/{sid}/turns", json={"message": "hi"}, headers={"traceparent": TRACEPARENT}
    )
    assert kept.status_code == 202
    session = runtime.sessions.get_session(kept.json()["session_id"])
    assert session.turn(kept.json()["turn_id"]).traceparent == TRACEPARENT
    assert trace_context("00-zz-nope-01") == ""
    assert trace_context(f"ff-{TRACE}-{PARENT}-01") == ""  # version ff is invalid
    assert trace_context(f"00-{'0' * 32}-{PARENT}-01") == ""


def test_tracing_is_off_unless_the_standard_variables_ask_and_off_costs_nothing() -> None:
    assert not tracing_asked({})
    assert not tracing_asked({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing_asked({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
    assert tracing_asked({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert isinstance(build_tracer({}), Untraced)
    assert isinstance(build_tracer({"OTEL_TRACES_EXPORTER": "console"}), OtelTracer)


def test_token_usage_is_a_prometheus_counter_by_provider_and_kind() -> None:
    registry = CollectorRegistry()
    metrics = ExecutionMetrics(registry)
    metrics.tokens_used("openai", {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17})
    metrics.tokens_used("openai", {"input_tokens": 3})
    assert (
        registry.get_sample_value(
            "turnlog_model_tokens_total", {"provider": "openai", "kind": "input"}
        )
        == 15
    )
    assert (
        registry.get_sample_value(
            "turnlog_model_tokens_total", {"provider": "openai", "kind": "output"}
        )
        == 5
    )
