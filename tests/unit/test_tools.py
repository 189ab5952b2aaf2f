"""The built-in tools and the argument check every tool gets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from turnlog.application.tools.builtin import MAX_SLEEP_SECONDS, builtin_tools
from turnlog.application.tools.port import (
    FunctionTool,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolSpec,
    check_arguments,
    result_summary,
)
from turnlog.domain.turns import Effect

registry = ToolRegistry(builtin_tools())


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    path = tmp_path / "sandbox"
    path.mkdir()
    return path


@pytest.fixture
def context(sandbox: Path) -> ToolContext:
    return ToolContext(session_id="s1", call_id="call-1", attempt=1, sandbox=sandbox)


def run(name: str, arguments: dict[str, Any], context: ToolContext) -> Any:
    tool = registry.get(name)
    assert tool is not None
    return tool.run(arguments, context)


# ------------------------------------------------------------------ declarations


def test_the_builtin_tools_declare_their_effect_classes() -> None:
    effects = {spec.name: spec.effect for spec in registry.specs()}

    assert effects == {
        "append_file": Effect.SIDE_EFFECTING,
        "echo": Effect.READ_ONLY,
        "sleep": Effect.READ_ONLY,
    }


def test_a_tool_declared_without_an_effect_is_side_effecting() -> None:
    assert ToolSpec("t", "d", {}).effect is Effect.SIDE_EFFECTING


def test_the_registry_refuses_a_tool_declared_twice() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        ToolRegistry([*builtin_tools(), builtin_tools()[0]])


def test_the_registry_gives_specs_for_the_names_it_knows() -> None:
    assert [s.name for s in registry.specs(["sleep", "nope", "echo"])] == ["sleep", "echo"]
    assert registry.get("nope") is None


# ------------------------------------------------------------------ argument checking

SPEC = ToolSpec(
    "t",
    "test",
    {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "o": {"type": "object"},
            "a": {"type": "array"},
        },
        "required": ["s"],
        "additionalProperties": False,
    },
)


def test_arguments_of_the_declared_types_pass() -> None:
    check_arguments(SPEC, {"s": "x", "i": 1, "n": 1.5, "b": True, "o": {}, "a": []})
    check_arguments(SPEC, {"s": "x", "n": 2})


def test_a_missing_required_argument_is_refused() -> None:
    with pytest.raises(ToolError, match="missing required argument 's'"):
        check_arguments(SPEC, {"i": 1})


def test_an_undeclared_argument_is_refused_when_the_schema_is_closed() -> None:
    with pytest.raises(ToolError, match="unexpected argument 'extra'"):
        check_arguments(SPEC, {"s": "x", "extra": 1})


def test_an_undeclared_argument_passes_when_the_schema_is_open() -> None:
    spec = ToolSpec("t", "test", {"properties": {}})

    check_arguments(spec, {"anything": 1})


@pytest.mark.parametrize(
    "arguments",
    [
        {"s": 1},
        {"s": "x", "i": 1.5},
        {"s": "x", "i": True},
        {"s": "x", "n": False},
        {"s": "x", "n": "1"},
        {"s": "x", "b": 1},
        {"s": "x", "o": []},
        {"s": "x", "a": {}},
    ],
)
def test_an_argument_of_the_wrong_type_is_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises(ToolError, match="must be of type"):
        check_arguments(SPEC, arguments)


def test_a_function_tool_checks_arguments_before_calling_its_function() -> None:
    calls: list[dict[str, Any]] = []
    tool = FunctionTool(SPEC, lambda arguments, context: calls.append(arguments))

    with pytest.raises(ToolError):
        tool.run({"i": 1}, ToolContext("s", "c", 1, Path()))

    assert calls == []


# ------------------------------------------------------------------ echo


def test_echo_returns_its_arguments(context: ToolContext) -> None:
    assert run("echo", {"text": "hi"}, context) == {"text": "hi"}
    assert run("echo", {}, context) == {}


def test_echo_refuses_text_that_is_not_a_string(context: ToolContext) -> None:
    with pytest.raises(ToolError):
        run("echo", {"text": 3}, context)


# ------------------------------------------------------------------ sleep


def test_sleep_of_zero_seconds_returns_at_once(context: ToolContext) -> None:
    assert run("sleep", {"seconds": 0}, context) == {"slept": 0.0}


@pytest.mark.parametrize("seconds", [-0.001, MAX_SLEEP_SECONDS + 1, float("inf"), float("nan")])
def test_sleep_refuses_seconds_outside_its_bounds(seconds: float, context: ToolContext) -> None:
    # By its schema (minimum, maximum), or, for NaN, which compares with nothing, by the tool.
    with pytest.raises(ToolError, match=r"between 0 and 300|the (minimum|maximum) of"):
        run("sleep", {"seconds": seconds}, context)


@pytest.mark.parametrize("arguments", [{}, {"seconds": "1"}, {"seconds": 1, "extra": 1}])
def test_sleep_refuses_malformed_arguments(arguments: dict[str, Any], context: ToolContext) -> None:
    with pytest.raises(ToolError):
        run("sleep", arguments, context)


# ------------------------------------------------------------------ append_file


def test_append_file_writes_exactly_one_line_inside_the_sandbox(
    sandbox: Path, context: ToolContext
) -> None:
    result = run("append_file", {"path": "notes/a.txt", "text": "first"}, context)

    assert (sandbox / "notes" / "a.txt").read_text() == "first\n"
    assert result == {"path": "notes/a.txt", "bytes": 6}


def test_append_file_appends_a_line_per_call_without_doubling_newlines(
    sandbox: Path, context: ToolContext
) -> None:
    run("append_file", {"path": "a.txt", "text": "one"}, context)
    run("append_file", {"path": "a.txt", "text": "two\n"}, context)

    assert (sandbox / "a.txt").read_text().splitlines() == ["one", "two"]


@pytest.mark.parametrize(
    "path",
    ["", "../outside.txt", "a/../../outside.txt", ".", "a/..", "x\x00y"],
)
def test_append_file_refuses_paths_outside_the_sandbox(
    path: str, sandbox: Path, context: ToolContext
) -> None:
    with pytest.raises(ToolError):
        run("append_file", {"path": path, "text": "x"}, context)

    assert list(sandbox.parent.rglob("*")) == [sandbox]


@pytest.mark.parametrize("where", ["outside.txt", "sandbox/inside.txt"])
def test_append_file_refuses_an_absolute_path_even_one_inside_the_sandbox(
    where: str, sandbox: Path, context: ToolContext
) -> None:
    with pytest.raises(ToolError, match="relative path"):
        run("append_file", {"path": str(sandbox.parent / where), "text": "x"}, context)

    assert list(sandbox.parent.rglob("*")) == [sandbox]


def test_append_file_refuses_a_symlink_that_leads_out_of_the_sandbox(
    sandbox: Path, context: ToolContext
) -> None:
    (sandbox / "link").symlink_to(sandbox.parent)

    with pytest.raises(ToolError, match="escapes"):
        run("append_file", {"path": "link/outside.txt", "text": "x"}, context)

    assert not (sandbox.parent / "outside.txt").exists()


@pytest.mark.parametrize("delay", [-1, MAX_SLEEP_SECONDS + 1])
def test_append_file_refuses_a_delay_outside_its_bounds_and_writes_nothing(
    delay: float, sandbox: Path, context: ToolContext
) -> None:
    with pytest.raises(ToolError, match="delay_seconds"):
        run("append_file", {"path": "a.txt", "text": "x", "delay_seconds": delay}, context)

    assert list(sandbox.iterdir()) == []


@pytest.mark.parametrize(
    "arguments",
    [{"path": "a.txt"}, {"text": "x"}, {"path": 1, "text": "x"}, {"path": "a", "text": 2}],
)
def test_append_file_refuses_malformed_arguments(
    arguments: dict[str, Any], sandbox: Path, context: ToolContext
) -> None:
    with pytest.raises(ToolError):
        run("append_file", arguments, context)

    assert list(sandbox.iterdir()) == []


# ------------------------------------------------------------------ summaries


def test_a_result_summary_is_short_json() -> None:
    assert result_summary({"a": 1}) == '{"a": 1}'
    summary = result_summary("x" * 500, limit=20)
    assert len(summary) == 20
    assert summary.endswith("…")


def test_idempotency_key_is_stable_for_a_call_and_differs_for_any_other() -> None:
    from turnlog.application.tools.context import ToolContext, idempotency_key

    key = idempotency_key("prod", "s-1", "call_1")
    assert key == idempotency_key("prod", "s-1", "call_1")  # a re-run gets the same key
    assert len({key, idempotency_key("dev", "s-1", "call_1")}) == 2
    assert len({key, idempotency_key("prod", "s-2", "call_1")}) == 2
    assert len({key, idempotency_key("prod", "s-1", "call_2")}) == 2
    attempt_1 = ToolContext("s-1", "call_1", 1, Path("."), namespace="prod")
    attempt_2 = ToolContext("s-1", "call_1", 2, Path("."), namespace="prod")
    assert attempt_1.idempotency_key == attempt_2.idempotency_key == key


DEPLOY = ToolSpec(
    "deploy",
    "test",
    {
        "type": "object",
        "required": ["env"],
        "additionalProperties": False,
        "properties": {
            "env": {"type": "string", "enum": ["staging", "prod"]},
            "tag": {"type": "string", "pattern": "^v[0-9]+$", "maxLength": 8},
            "replicas": {"type": "integer", "minimum": 1, "maximum": 5},
            "labels": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "limits": {
                "type": "object",
                "properties": {"cpu": {"type": "number", "exclusiveMinimum": 0}},
                "additionalProperties": False,
            },
        },
    },
)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"env": "--help; not-an-env"}, "argument 'env': '--help; not-an-env' is not one of"),
        ({"env": "prod", "tag": "latest"}, "argument 'tag': 'latest' does not match"),
        ({"env": "prod", "tag": "v123456789"}, "argument 'tag': 'v123456789' is too long"),
        ({"env": "prod", "replicas": 0}, "argument 'replicas': 0 is less than the minimum"),
        ({"env": "prod", "replicas": 9}, "argument 'replicas': 9 is greater than the maximum"),
        ({"env": "prod", "labels": ["a", ""]}, "argument 'labels[1]': '' should be non-empty"),
        ({"env": "prod", "limits": {"cpu": 0}}, "argument 'limits.cpu': 0 is less than or equal"),
        ({"env": "prod", "limits": {"gpu": 1}}, "unexpected argument 'gpu' in argument 'limits'"),
    ],
)
def test_everything_the_json_schema_says_is_enforced(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ToolError) as refused:
        check_arguments(DEPLOY, arguments)
    assert named in str(refused.value)


def test_arguments_that_meet_the_whole_schema_pass() -> None:
    check_arguments(
        DEPLOY,
        {"env": "prod", "tag": "v12", "replicas": 3, "labels": ["x"], "limits": {"cpu": 0.5}},
    )


def test_the_built_in_tools_bound_their_delays_in_their_schemas() -> None:
    tools = {t.spec.name: t.spec for t in builtin_tools()}
    with pytest.raises(ToolError, match="argument 'seconds': -1 is less than the minimum"):
        check_arguments(tools["sleep"], {"seconds": -1})
    with pytest.raises(ToolError, match="'delay_seconds': 301 is greater than the maximum"):
        check_arguments(tools["append_file"], {"path": "a", "text": "b", "delay_seconds": 301})


def test_a_parameters_schema_that_is_not_valid_json_schema_is_refused() -> None:
    from turnlog.application.tools.port import check_parameters_schema

    bad = {"type": "object", "properties": {"n": {"type": "integer", "minimum": "one"}}}
    with pytest.raises(ValueError, match=r"not a valid JSON Schema \(Draft 2020-12\)"):
        check_parameters_schema(bad)
