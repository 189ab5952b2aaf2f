"""The built-in tools: echo, sleep and append_file (for demonstrations and tests).

Each is bounded and stoppable as a command tool is: ``sleep`` and
``append_file`` run on a thread of their own (``FunctionTool.timeout``), so
a call returns at its timeout, or at once when a cancel stops it (a forced
cancel for ``append_file``), whatever the function is blocked in. ``echo``
only copies its arguments and runs inline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.port import (
    FunctionTool,
    Tool,
    ToolError,
    ToolOutcomeUnknown,
    ToolSpec,
)
from turnlog.application.tools.probes import AppendFileProber
from turnlog.application.tools.sandbox_files import SandboxPathError, append_line, path_parts
from turnlog.domain.turns import Effect

MAX_SLEEP_SECONDS = 300.0
# Seconds a built-in call may take besides the delay it was asked for: a line
# is appended in milliseconds; a file system that does not answer in this
# long leaves the call's outcome unknown instead of the worker's slot wedged.
BUILTIN_TIMEOUT = 10.0


def _echo(arguments: dict[str, Any], context: ToolContext) -> Any:
    return arguments


def _sleep(arguments: dict[str, Any], context: ToolContext) -> Any:
    seconds = float(arguments.get("seconds", 0))
    if not 0 <= seconds <= MAX_SLEEP_SECONDS:
        raise ToolError(f"sleep: seconds must be between 0 and {MAX_SLEEP_SECONDS:g}")
    context.stop.wait(seconds)  # returns early when the call is stopped
    return {"slept": seconds}


def sandbox_path(sandbox: Path, relative: str) -> Path:
    """Check ``relative`` names a file inside ``sandbox`` as things are now (refuse early).

    Only a first check, before any delay: the write itself opens the path
    relative to the sandbox's descriptor without following links
    (``sandbox_files``), so a directory swapped for a link meanwhile is refused.
    """
    try:
        parts = path_parts(relative)
    except SandboxPathError as exc:
        raise ToolError(str(exc)) from None
    root = sandbox.resolve()
    target = root.joinpath(*parts).resolve()
    if root not in target.parents:
        raise ToolError(f"path {relative!r} escapes the session's sandbox")
    return target


def _append_file(arguments: dict[str, Any], context: ToolContext) -> Any:
    delay = float(arguments.get("delay_seconds", 0))
    if not 0 <= delay <= MAX_SLEEP_SECONDS:
        raise ToolError(f"append_file: delay_seconds must be between 0 and {MAX_SLEEP_SECONDS:g}")
    relative = str(arguments["path"])
    sandbox_path(context.sandbox, relative)
    text = str(arguments["text"])
    # The delay comes before the write, so a test can kill the worker mid-call
    # and prove the write happened at most once.
    if context.stop.wait(delay):
        raise ToolOutcomeUnknown("append_file: stopped before writing")
    line = text if text.endswith("\n") else text + "\n"
    try:
        stored = append_line(context.sandbox, relative, line)
    except SandboxPathError as exc:
        raise ToolError(f"append_file: {exc}") from None
    return {"path": stored, "bytes": len(line.encode())}


def _object(properties: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def builtin_tools() -> list[Tool]:
    """echo (read_only), sleep (read_only) and append_file (side_effecting)."""
    return [
        FunctionTool(
            ToolSpec(
                "echo",
                "Return the arguments unchanged.",
                {"type": "object", "properties": {"text": {"type": "string"}}},
                Effect.READ_ONLY,
            ),
            _echo,
        ),
        FunctionTool(
            ToolSpec(
                "sleep",
                "Wait for a number of seconds, then return.",
                _object(
                    {"seconds": {"type": "number", "minimum": 0, "maximum": MAX_SLEEP_SECONDS}},
                    ["seconds"],
                ),
                Effect.READ_ONLY,
            ),
            _sleep,
            timeout=BUILTIN_TIMEOUT,
            waits="seconds",
        ),
        FunctionTool(
            ToolSpec(
                "append_file",
                "Append a line of text to a file in the session's sandbox, after a delay.",
                _object(
                    {
                        "path": {"type": "string"},
                        "text": {"type": "string"},
                        "delay_seconds": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": MAX_SLEEP_SECONDS,
                        },
                    },
                    ["path", "text"],
                ),
                Effect.SIDE_EFFECTING,
            ),
            _append_file,
            AppendFileProber(),
            timeout=BUILTIN_TIMEOUT,
            waits="delay_seconds",
        ),
    ]
