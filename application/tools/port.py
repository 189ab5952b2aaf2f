"""Tools behind one port, with effect classes (the built-in tools are in ``builtin``).

A tool's effect class decides recovery: ``read_only`` and ``idempotent``
tools are run again when their owner died mid-call; ``side_effecting`` ones
(the default) are never repeated behind anyone's back.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from jsonschema import Draft202012Validator, SchemaError, ValidationError

from turnlog.application.errors import ConfigurationError
from turnlog.application.tools.context import ToolContext
from turnlog.domain.turns import Effect

# How often a bounded function tool's caller looks at the call's stop event,
# and how long it then gives the function to return by itself.
STOP_POLL_SECONDS = 0.05
STOP_GRACE_SECONDS = 0.2


# The built-in tools: for demonstrations and tests, not for a real model's sessions.
DEMO_TOOLS = frozenset({"echo", "sleep", "append_file"})


def default_tools(
    available: Sequence[str], provider: str, configured: Sequence[str] | None = None
) -> list[str]:
    """The tools a new session gets when its creator names none.

    The configured list when there is one; otherwise every tool for the
    fixture provider, and every tool but the demonstration ones for a real
    provider (a real model should not be offered ``append_file`` or ``sleep``).
    """
    if configured is not None:
        return list(dict.fromkeys(configured))
    if provider == "fixture":
        return list(available)
    return [name for name in available if name not in DEMO_TOOLS]


class ToolError(Exception):
    """The tool refused its arguments or failed; recorded as ToolCallFailed."""


class ToolOutcomeUnknown(Exception):
    """The tool's other side went away mid-call (an MCP server died): it may have acted or not.

    The call stays in flight, as if its owner had died: a read_only or
    idempotent call runs again, a side_effecting one interrupts the turn.
    """


@dataclass(frozen=True)
class ToolSpec:
    """A tool's declaration: what the model sees and how recovery treats it."""

    name: str
    description: str
    parameters: dict[str, Any]
    effect: Effect = Effect.SIDE_EFFECTING
    # True: each call waits for an operator's approval before it starts.
    approval_required: bool = False


class Tool(Protocol):
    """Something the model can call."""

    @property
    def spec(self) -> ToolSpec: ...

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Any: ...


@dataclass(frozen=True)
class FunctionTool:
    """A tool implemented by a Python function of this process.

    With a ``timeout``, the function runs on a thread of its own and the
    call returns when it does, when the call is stopped (its ``stop`` event:
    a cancel, or a forced cancel of a side-effecting call) or when the
    timeout passes — whichever comes first. So a function stuck in a system
    call (an ``open()`` that blocks) cannot hold a worker's slot, and a
    cancel or a forced cancel stops the call as it stops a command tool's.
    A thread cannot be killed: a stuck one is left behind, and a
    side-effecting call it may still complete has an unknown outcome
    (``ToolOutcomeUnknown``: the turn is interrupted for an operator).
    Without a timeout the function runs inline: for one that only computes.
    """

    spec: ToolSpec
    function: Callable[[dict[str, Any], ToolContext], Any] = field(repr=False)
    # Its probe (application/tools/probes.py), asked by recovery (unless probes are off).
    prober: Any = field(default=None, repr=False)
    # Seconds a call may take besides what it waits on purpose (None: unbounded, inline).
    timeout: float | None = None
    # The argument naming seconds the call waits on purpose (sleep's ``seconds``,
    # append_file's ``delay_seconds``): they are added to the timeout.
    waits: str = ""

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        check_arguments(self.spec, arguments)
        if self.timeout is None:
            return self.function(arguments, context)
        waited = arguments.get(self.waits, 0) if self.waits else 0
        waited = float(waited) if isinstance(waited, int | float) else 0.0
        return self._bounded(arguments, context, self.timeout + max(0.0, waited))

    def _bounded(self, arguments: dict[str, Any], context: ToolContext, seconds: float) -> Any:
        name = self.spec.name
        finished = threading.Event()
        ended: list[tuple[bool, Any]] = []

        def call() -> None:
            try:
                ended.append((True, self.function(arguments, context)))
            except BaseException as exc:  # handed to the caller, raised there
                ended.append((False, exc))
            finally:
                finished.set()

        threading.Thread(target=call, name=f"turnlog-tool-{name}", daemon=True).start()
        deadline = time.monotonic() + seconds
        while not finished.wait(max(0.0, min(STOP_POLL_SECONDS, deadline - time.monotonic()))):
            if context.stop.is_set():
                if finished.wait(STOP_GRACE_SECONDS):
                    break
                raise ToolOutcomeUnknown(f"{name}: stopped while it ran; it may still act")
            if time.monotonic() >= deadline:
                if self.spec.effect.safe_to_repeat:
                    raise ToolError(f"{name}: timed out after {seconds:g}s")
                raise ToolOutcomeUnknown(f"{name}: timed out after {seconds:g}s; it may still act")
        returned, value = ended[0]
        if returned:
            return value
        raise value


@dataclass
class _Deferred:
    """Tools listed on first need (an MCP server's): who they are, and how to get them."""

    label: str
    owns: Callable[[str], bool]  # may a tool of this name be one of them?
    load: Callable[[], Sequence[Tool]]


class ToolRegistry:
    """The tools a process can run, by name.

    Some tools are known only once their source is asked (an MCP server lists
    them when started): ``defer`` adds such a source, loaded the first time a
    name it may own is looked up, or all names are (``names``, ``specs``,
    ``load``). A source that fails to load raises (a ``ConfigurationError``)
    and is asked again next time. ``loaded`` never loads.
    """

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._deferred: list[_Deferred] = []
        self._closers: list[Callable[[], None]] = []
        self._lock = threading.RLock()
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        if tool.spec.name in self._tools:
            raise ValueError(f"tool {tool.spec.name!r} is declared twice")
        self._tools[tool.spec.name] = tool

    def defer(
        self, label: str, owns: Callable[[str], bool], load: Callable[[], Sequence[Tool]]
    ) -> None:
        """Add tools that ``load`` lists when first needed (``label`` names them in errors)."""
        self._deferred.append(_Deferred(label, owns, load))

    def load(self, name: str | None = None) -> None:
        """Load the deferred sources (only those that may own ``name``, if given)."""
        if not self._deferred:
            return
        with self._lock:
            for source in list(self._deferred):
                if name is not None and not source.owns(name):
                    continue
                tools = list(source.load())  # raises: left deferred, asked again
                for tool in tools:
                    try:
                        self.add(tool)
                    except ValueError as exc:
                        raise ConfigurationError(f"{source.label}: {exc}") from None
                self._deferred.remove(source)

    def get(self, name: str) -> Tool | None:
        tool = self._tools.get(name)
        if tool is None and self._deferred:
            self.load(name)
            tool = self._tools.get(name)
        return tool

    def loaded(self) -> list[Tool]:
        """The tools known now, loading nothing."""
        return list(self._tools.values())

    def names(self) -> list[str]:
        self.load()
        return sorted(self._tools)

    def specs(self, names: Sequence[str] = ()) -> list[ToolSpec]:
        chosen = names or self.names()
        return [t.spec for t in (self.get(n) for n in chosen) if t is not None]

    def on_close(self, closer: Callable[[], None]) -> None:
        """Call ``closer`` when the registry is closed (its tools' sessions)."""
        self._closers.append(closer)

    def close(self) -> None:
        for closer in reversed(self._closers):
            closer()
        self._closers.clear()


_JSON_TYPES = ("string", "integer", "number", "boolean", "object", "array")
MAX_ARGUMENT_ERRORS = 5  # named in one refusal; the rest are counted


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema_json))


def check_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> None:
    """Check arguments against the tool's parameters, a JSON Schema (Draft 2020-12).

    Everything the schema says is enforced — types, ``enum``, ``pattern``,
    ``minimum``/``maximum``, lengths, nested objects and arrays — before the
    tool runs. A refusal is a ``ToolError`` naming each failing argument; the
    model is answered with it and the tool is never executed.
    """
    validator = _validator(json.dumps(spec.parameters, sort_keys=True))
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    reasons = [_reason(e) for e in errors[:MAX_ARGUMENT_ERRORS]]
    if len(errors) > MAX_ARGUMENT_ERRORS:
        reasons.append(f"and {len(errors) - MAX_ARGUMENT_ERRORS} more")
    raise ToolError(f"{spec.name}: invalid arguments: " + "; ".join(reasons))


def _reason(error: ValidationError) -> str:
    """One failing argument, in words a model (and an operator) can act on."""
    where = "".join(
        f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p))
        for i, p in enumerate(error.absolute_path)
    )
    subject = f"argument {where!r}" if where else "the arguments"
    instance, schema, expected = error.instance, error.schema, error.validator_value
    if error.validator == "required" and isinstance(instance, dict) and isinstance(expected, list):
        missing = [n for n in expected if n not in instance]
        return f"{subject}: missing required argument {missing[0]!r}".removeprefix(
            "the arguments: "
        )
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        allowed = set(schema.get("properties", {})) if isinstance(schema, dict) else set()
        extra = sorted(k for k in instance if k not in allowed)
        if extra:
            names = ", ".join(repr(k) for k in extra)
            return f"unexpected argument {names}" + (f" in {subject}" if where else "")
    if error.validator == "type":
        return f"{subject} must be of type {expected}"
    return f"{subject}: {error.message}"


def check_parameters_schema(parameters: Any) -> None:
    """Refuse a parameters schema that ``check_arguments`` (and a model) cannot use.

    It must be a valid JSON Schema (Draft 2020-12) describing an object:
    ``properties`` maps names to schemas whose ``type``, when given, is a JSON
    type; ``required`` lists declared names.
    """
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ValueError('parameters must be a JSON schema with "type": "object"')
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise ValueError("parameters.properties must be an object")
    for name, schema in properties.items():
        if not isinstance(schema, dict):
            raise ValueError(f"parameters.properties.{name} must be an object (a JSON schema)")
        kind = schema.get("type")
        if kind is not None and (not isinstance(kind, str) or kind not in _JSON_TYPES):
            raise ValueError(
                f"parameters.properties.{name}.type {kind!r} is not one of {sorted(_JSON_TYPES)}"
            )
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(r in properties for r in required):
        raise ValueError("parameters.required must list names declared in parameters.properties")
    if not isinstance(parameters.get("additionalProperties", True), bool):
        raise ValueError("parameters.additionalProperties must be true or false")
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ValueError(
            f"parameters is not a valid JSON Schema (Draft 2020-12)"
            f"{' at ' + where if where else ''}: {exc.message}"
        ) from None


def result_summary(value: Any, limit: int = 200) -> str:
    """A short JSON rendering of a tool result, for tables and logs."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
