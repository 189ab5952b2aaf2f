"""Tools that run a command in the session's sandbox: ``shell``, and tools declared in a file.

A command tool's ``command`` is an argv template: each element may hold
``{argument}`` placeholders, filled with the call's arguments. Each element
stays one argv element whatever the argument contains — no shell ever parses
it — so an argument like ``; rm -rf ~`` is just text. (The ``shell`` tool is
the one place a shell runs, by design: its template is ``sh -c {command}``.)
An element that names an optional argument the call left out is dropped, so
``"--limit={limit}"`` is passed only when ``limit`` is.

The sandbox directory is the working directory and ``HOME``; the environment
is minimal (no ``TURNLOG_*`` settings, no keys). The command runs in an OS
sandbox (application/tools/containment.py, docs/containment.md): its own
unprivileged user, namespaces of its own, the session's directory the only
one it can write or even see of the data directory, no network unless the
tool is granted it, and limits. A command the sandbox stopped at a limit
(SIGXCPU, SIGXFSZ) is a failed call saying which limit.

A tools file (``TURNLOG_TOOLS_FILE``, TOML or JSON) declares ``tools``, each
with ``name``, ``description``, ``parameters`` (a JSON schema of an object),
``effect`` (read_only, idempotent, side_effecting), ``command`` and optionally
``timeout_seconds``, ``approval`` (``"required"``: each call waits for an
operator's approval) and ``sandbox`` (its limits and network grant, over the
file's ``[sandbox]`` defaults). A bad file is refused when the process starts.

A declaration may add a ``probe``: an argv template with the same rules,
run in the same sandbox with the same environment (and the intent's
pre-state in ``TURNLOG_PROBE_PRE_STATE``) when recovery finds the call in
flight after its owner died; ``probe_timeout_seconds`` bounds it and
``rerun_when_not_applied`` lets a ``not_applied`` answer run the call again
(application/tools/probes.py has the answer's contract).
"""

from __future__ import annotations

import json
import os
import re
import signal
import string
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from turnlog.application.errors import ConfigurationError
from turnlog.application.tools.containment import (
    Containment,
    ContainmentError,
    Grant,
    SandboxOptions,
    sandbox_options,
)
from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.port import (
    Tool,
    ToolError,
    ToolRegistry,
    ToolSpec,
    check_arguments,
    check_parameters_schema,
)
from turnlog.application.tools.probes import (
    DEFAULT_PROBE_TIMEOUT,
    ProbeReport,
    parse_answer,
    unknown,
)
from turnlog.application.tools.processes import run_contained
from turnlog.application.tools.sandbox_files import SandboxPathError, descriptor_path, sandbox_dir
from turnlog.domain.turns import Effect, ToolProcess

DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 3600.0
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what OpenAI-compatible APIs accept
_ENTRY_KEYS = {
    "name",
    "description",
    "parameters",
    "effect",
    "command",
    "timeout_seconds",
    "approval",
    "sandbox",
}
APPROVALS = ("none", "required")
# A declaration's probe (application/tools/probes.py).
_ENTRY_KEYS |= {"probe", "probe_timeout_seconds", "rerun_when_not_applied"}
# Sections of the tools file read elsewhere: Python tool modules (python_tools), MCP
# servers (mcp_tools).
OTHER_SECTIONS = {"modules", "mcp_servers", "sandbox"}
_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}

SHELL_SPEC = ToolSpec(
    "shell",
    "Run a command line with /bin/sh in the session's sandbox directory. "
    "Returns the exit code and the (possibly truncated) output.",
    {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command line."}},
        "required": ["command"],
        "additionalProperties": False,
    },
    Effect.SIDE_EFFECTING,
)


@dataclass(frozen=True)
class CommandTool:
    """A tool that runs an argv template in the session's sandbox, as its own process group."""

    spec: ToolSpec
    command: tuple[str, ...]
    timeout: float = DEFAULT_TIMEOUT
    output_limit: int = 16 * 1024
    prober: CommandProber | None = None
    grant: Grant = field(default_factory=Grant)
    containment: Containment = field(default_factory=Containment)

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        check_arguments(self.spec, arguments)
        argv = render_command(self.command, arguments)
        try:
            # The working directory is the sandbox opened without following a
            # link, so a sandbox swapped for a link is refused, not entered.
            with sandbox_dir(context.sandbox) as fd:
                result = run_contained(
                    self.containment,
                    argv,
                    sandbox=context.sandbox,
                    grant=self.grant,
                    env=command_env(context),
                    cwd=descriptor_path(fd, context.sandbox),
                    timeout=self.timeout,
                    output_limit=self.output_limit,
                    report=context.report_process,
                )
        except SandboxPathError as exc:
            raise ToolError(f"{self.spec.name}: the sandbox cannot be entered: {exc}") from None
        if result.timed_out:
            raise ToolError(
                f"{self.spec.name}: timed out after {self.timeout:g}s; its process group was "
                f"killed. Output so far: {result.stdout[-500:]!r}"
            )
        stopped = limit_hit(result.exit_code, self.grant if self.containment.enabled else None)
        if stopped:
            raise ToolError(f"{self.spec.name}: {stopped}. Output so far: {result.stdout[-500:]!r}")
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "truncated": result.truncated,
        }


@dataclass(frozen=True)
class CommandProber:
    """A declared tool's probe: an argv template run like the command, answering on stdout."""

    command: tuple[str, ...]
    timeout: float = DEFAULT_PROBE_TIMEOUT
    rerun_when_not_applied: bool = False
    output_limit: int = 16 * 1024
    grant: Grant = field(default_factory=Grant)
    containment: Containment = field(default_factory=Containment)

    def prepare(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        return {}  # a command cannot record anything before the intent is written

    def probe(
        self, arguments: dict[str, Any], context: ToolContext, pre_state: dict[str, Any]
    ) -> ProbeReport:
        argv = render_command(self.command, arguments)
        env = command_env(context) | {
            "TURNLOG_PROBE": "1",
            "TURNLOG_PROBE_PRE_STATE": json.dumps(pre_state),
            "TURNLOG_TOOL_ARGUMENTS": json.dumps(arguments),
        }
        try:
            with sandbox_dir(context.sandbox) as fd:
                result = run_contained(
                    self.containment,
                    argv,
                    sandbox=context.sandbox,
                    grant=self.grant,
                    env=env,
                    cwd=descriptor_path(fd, context.sandbox),
                    timeout=self.timeout,
                    output_limit=self.output_limit,
                    report=_unrecorded,  # a probe changes nothing: its process is not recorded
                )
        except SandboxPathError as exc:
            return unknown(f"the sandbox cannot be entered: {exc}")
        code = None if result.timed_out else result.exit_code
        return parse_answer(code, result.stdout, result.stderr, self.timeout)


def _unrecorded(process: ToolProcess) -> None:
    return None


# Exit statuses (128 + signal, as the shell reports a child's) of a process the kernel
# stopped at one of the sandbox's limits.
_LIMIT_SIGNALS = {
    128 + signal.SIGXCPU: ("CPU time", "cpu_seconds", "s"),
    128 + signal.SIGXFSZ: ("file size", "file_size_mb", " MiB"),
    -signal.SIGXCPU: ("CPU time", "cpu_seconds", "s"),
    -signal.SIGXFSZ: ("file size", "file_size_mb", " MiB"),
}


def limit_hit(exit_code: int | None, grant: Grant | None) -> str:
    """Which sandbox limit stopped the command, judged by its exit status ('' when none)."""
    if grant is None or exit_code not in _LIMIT_SIGNALS:
        return ""
    what, option, unit = _LIMIT_SIGNALS[exit_code]
    value = getattr(grant.limits, option)
    return f"stopped by the sandbox at its {what} limit ({option} = {value}{unit})"


def shell_tool(
    timeout: float,
    output_limit: int,
    *,
    grant: Grant | None = None,
    containment: Containment | None = None,
) -> CommandTool:
    """The ``shell`` tool: side-effecting, off unless the settings turn it on."""
    return CommandTool(
        SHELL_SPEC,
        ("/bin/sh", "-c", "{command}"),
        timeout,
        output_limit,
        grant=grant or Grant(),
        containment=containment or Containment(),
    )


def command_env(context: ToolContext) -> dict[str, str]:
    """A minimal environment: nothing of this process's settings or secrets leaks in."""
    return context.trace_env() | {
        "PATH": os.environ.get("PATH", os.defpath),
        "LANG": "C.UTF-8",
        "HOME": str(context.sandbox),
        "TURNLOG_SESSION_ID": context.session_id,
        "TURNLOG_CALL_ID": context.call_id,  # the model's id, unique only within the session
        # Unique across namespaces, sessions and calls; the same when this call is re-run.
        "TURNLOG_IDEMPOTENCY_KEY": context.idempotency_key,
        "TURNLOG_ATTEMPT": str(context.attempt),
    }


def render_command(template: Sequence[str], arguments: dict[str, Any]) -> list[str]:
    """Fill each argv element's placeholders; drop elements naming an absent argument."""
    argv = []
    for element in template:
        parts, complete = [], True
        for literal, name, _, _ in string.Formatter().parse(element):
            parts.append(literal)
            if name is None:
                continue
            if name not in arguments:
                complete = False
                break
            parts.append(_as_text(arguments[name]))
        if complete:
            rendered = "".join(parts)
            if "\x00" in rendered:
                raise ToolError("arguments must not contain NUL characters")
            argv.append(rendered)
    return argv


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


# ------------------------------------------------------------------ tools file


def add_declared_tools(
    registry: ToolRegistry,
    path: Path,
    output_limit: int,
    containment: Containment | None = None,
) -> None:
    """Add the tools of a tools file, refusing a bad file with one clear error."""
    for tool in load_tools_file(path, output_limit, containment):
        try:
            registry.add(tool)
        except ValueError as exc:
            raise ConfigurationError(f"tools file {path}: {exc}") from None


def load_tools_file(
    path: Path,
    output_limit: int,
    containment: Containment | None = None,
    options: SandboxOptions | None = None,
) -> list[Tool]:
    """Parse and check every declaration of a TOML or JSON tools file."""
    data = _read(path)
    containment = containment or Containment()
    if options is None:
        options = file_sandbox_options(path, data)
    entries = data.get("tools") if isinstance(data, dict) else None
    if entries is None and isinstance(data, dict) and set(data) & OTHER_SECTIONS:
        entries = []  # a file of Python tool modules (or MCP servers) only
    if not isinstance(entries, list):
        raise ConfigurationError(f"tools file {path}: expected a list named 'tools'")
    tools: list[Tool] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries, 1):
        try:
            tool = _declared_tool(entry, output_limit)
            grant = options.grant(tool.spec.name, entry.get("sandbox"))
            prober = tool.prober and replace(tool.prober, grant=grant, containment=containment)
            tool = replace(tool, grant=grant, containment=containment, prober=prober)
        except (ValueError, TypeError) as exc:
            name = entry.get("name") if isinstance(entry, dict) else None
            label = f"tool #{index}" + (f" ({name!r})" if isinstance(name, str) else "")
            raise ConfigurationError(f"tools file {path}: {label}: {exc}") from None
        if tool.spec.name in seen:
            raise ConfigurationError(f"tools file {path}: tool {tool.spec.name!r} declared twice")
        seen.add(tool.spec.name)
        tools.append(tool)
    return tools


def file_sandbox_options(path: Path, data: Any) -> SandboxOptions:
    """The file's ``[sandbox]`` table, or ConfigurationError naming the file and the tool."""
    try:
        return sandbox_options(data)
    except ContainmentError as exc:
        raise ConfigurationError(f"tools file {path}: {exc}") from None


def read_tools_file(path: Path) -> Any:
    """The parsed tools file (TOML or JSON), or ConfigurationError naming the problem."""
    return _read(path)


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"tools file {path} cannot be read: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            return tomllib.loads(text)
        if path.suffix == ".json":
            return json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigurationError(
            f"tools file {path} is not valid {path.suffix[1:]}: {exc}"
        ) from None
    raise ConfigurationError(f"tools file {path}: the name must end in .toml or .json")


def _declared_tool(entry: Any, output_limit: int) -> CommandTool:
    if not isinstance(entry, dict):
        raise ValueError("each tool must be a table (object)")
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise ValueError(f"unknown keys {unknown}; allowed: {sorted(_ENTRY_KEYS)}")
    name = entry.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ValueError("name must be 1-64 letters, digits, '_' or '-'")
    description = entry.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("description must be a non-empty string")
    parameters = entry.get("parameters", _EMPTY_OBJECT)
    check_parameters_schema(parameters)
    effect = entry.get("effect", str(Effect.SIDE_EFFECTING))
    if effect not in {e.value for e in Effect}:
        raise ValueError(f"unknown effect {effect!r}; use one of {[e.value for e in Effect]}")
    command = _checked_command(entry.get("command"), parameters)
    timeout = entry.get("timeout_seconds", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ValueError("timeout_seconds must be a number")
    if not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout_seconds must be more than 0 and at most {MAX_TIMEOUT:g}")
    approval = entry.get("approval", "none")
    if approval not in APPROVALS:
        raise ValueError(f"approval must be one of {list(APPROVALS)}, not {approval!r}")
    spec = ToolSpec(
        name, description.strip(), parameters, Effect(effect), approval_required=approval != "none"
    )
    return CommandTool(spec, command, float(timeout), output_limit, _prober(entry, parameters))


def _prober(entry: dict[str, Any], parameters: dict[str, Any]) -> CommandProber | None:
    """The declaration's probe, or None; the probe's options without a probe are refused."""
    if "probe" not in entry:
        if {"probe_timeout_seconds", "rerun_when_not_applied"} & set(entry):
            raise ValueError("probe_timeout_seconds and rerun_when_not_applied need a probe")
        return None
    try:
        probe = _checked_command(entry["probe"], parameters)
    except ValueError as exc:
        raise ValueError(f"probe: {exc}") from None
    timeout = entry.get("probe_timeout_seconds", DEFAULT_PROBE_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ValueError("probe_timeout_seconds must be a number")
    if not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"probe_timeout_seconds must be more than 0 and at most {MAX_TIMEOUT:g}")
    rerun = entry.get("rerun_when_not_applied", False)
    if not isinstance(rerun, bool):
        raise ValueError("rerun_when_not_applied must be true or false")
    return CommandProber(probe, float(timeout), rerun)


def _checked_command(command: Any, parameters: dict[str, Any]) -> tuple[str, ...]:
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise ValueError("command must be a non-empty list of strings (argv, no shell)")
    if "{" in command[0] or "}" in command[0]:
        raise ValueError("the program (first element of command) must not be a placeholder")
    declared = set(parameters.get("properties", {}))
    for element in command:
        for _, name, spec, conversion in string.Formatter().parse(element):
            if name is None:
                continue
            if spec or conversion or name not in declared:
                raise ValueError(
                    f"placeholder {{{name}}} in {element!r} must name a declared parameter "
                    "(plain {name}, no format spec; write {{ and }} for literal braces)"
                )
    return tuple(command)
