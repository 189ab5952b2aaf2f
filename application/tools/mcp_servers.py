"""Tools offered by MCP servers (Model Context Protocol), declared in the tools file.

Each ``[[mcp_servers]]`` entry names a server reached over stdio (``command``:
an argv started as a process) or streamable HTTP (``url``, on an allowed host:
loopback unless ``allowed_hosts`` says more). The entries are checked when
the tools are built; a server is started when its tools are first needed
(``ToolRegistry.defer``: a serve role at start-up, a one-shot command only if
it lists or runs tools). A server that cannot start, a tool without an input
schema, or two tools with one name are refused then, naming the cause. Each
tool is offered as ``<prefix><tool>`` (prefix ``<server>_`` unless given), so
sessions choose MCP tools by those names like any other.

Effect class: the tools file's (``[mcp_servers.tools.<tool>] effect = …``),
else the server's annotations (``readOnlyHint`` → read_only,
``idempotentHint`` → idempotent), else side_effecting — never assumed safe.

Every call of a process goes to one session per server (``mcp_sessions``:
started on first use, reused, started again after the server died), bounded
by the tool's timeout: a call that overruns is cut off with its server
process and fails. A stdio server's pid and start time are recorded for each
call before the request leaves (ToolCallProcessStarted, with the server's
name). Arguments are checked against the tool's input schema before anything
is sent. The call's idempotency key travels in the request's ``_meta``
(``turnlog/idempotency_key``, with the session, call id and attempt). A
connection that breaks while the call is in flight (the server died) leaves
the outcome unknown: ``ToolOutcomeUnknown``, which the executor treats like
an owner's death — re-run a read_only or idempotent call, interrupt the turn
for a side_effecting one.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from turnlog.application.errors import ConfigurationError
from turnlog.application.tools.containment import (
    Containment,
    ContainmentError,
    Grant,
    Limits,
    check_host,
    parse_grant,
)
from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.mcp_sessions import (
    START_TIMEOUT,
    McpSessions,
    NotSent,
    ServerUnavailable,
)
from turnlog.application.tools.mcp_transport import DEFAULT_TIMEOUT, McpServer, describe
from turnlog.application.tools.port import (
    ToolError,
    ToolRegistry,
    ToolSpec,
    check_arguments,
    check_parameters_schema,
)
from turnlog.domain.turns import Effect

MAX_TIMEOUT = 3600.0
log = logging.getLogger("turnlog.mcp")

SEND_ATTEMPTS = 3  # sessions tried for one call when each ends before the request leaves
SERVER_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what OpenAI-compatible APIs accept
LOOPBACK = ("127.0.0.1", "::1", "localhost")
META_PREFIX = "turnlog/"
_SERVER_KEYS = {
    "name",
    "command",
    "url",
    "env",
    "cwd",
    "prefix",
    "timeout_seconds",
    "allowed_hosts",
    "tools",
    "sandbox",
}
_TOOL_KEYS = {"effect", "timeout_seconds"}


@dataclass(frozen=True)
class McpTool:
    """A tool of an MCP server, called on its process's session (``McpSessions``)."""

    spec: ToolSpec
    server: McpServer
    remote_name: str
    sessions: McpSessions = field(repr=False, compare=False)
    timeout: float = DEFAULT_TIMEOUT

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        check_arguments(self.spec, arguments)  # before anything starts
        meta = {
            f"{META_PREFIX}idempotency_key": context.idempotency_key,
            f"{META_PREFIX}session_id": context.session_id,
            f"{META_PREFIX}call_id": context.call_id,
            f"{META_PREFIX}attempt": context.attempt,
        }
        for _ in range(SEND_ATTEMPTS):
            try:
                held = self.sessions.acquire(self.server)
            except (ServerUnavailable, TimeoutError) as exc:
                raise ToolError(f"{self.spec.name}: {exc}; the call was not sent") from None
            if held.process is not None:
                # On record before the request leaves: recovery, probes and gc see the server.
                context.report_process(held.process)
            try:
                result = self.sessions.call(
                    held,
                    self.remote_name,
                    arguments,
                    meta,
                    self.timeout,
                    context.stop,
                    self.spec.name,
                )
            except NotSent:
                continue  # its server had gone; the next round starts it again
            return _result(self.spec.name, result)
        raise ToolError(f"{self.spec.name}: {self.server} kept ending before the call was sent")


def _result(name: str, result: Any) -> Any:
    """A CallToolResult as a stored result: structured content, else the text, else the parts."""
    parts = [p.model_dump(mode="json", exclude_none=True) for p in result.content]
    texts = [p.get("text", "") for p in parts if p.get("type") == "text"]
    if result.isError:
        raise ToolError(f"{name}: " + ("\n".join(texts) or "the server reported an error"))
    if result.structuredContent is not None:
        return result.structuredContent
    if len(parts) == 1 and len(texts) == 1:
        return texts[0]
    return parts


# ------------------------------------------------------------ start-up


def add_mcp_tools(
    registry: ToolRegistry,
    data: Any,
    source: Path,
    containment: Containment | None = None,
    defaults: Limits | None = None,
    homes: Path | None = None,
) -> None:
    """Check every ``[[mcp_servers]]`` entry now; list each server's tools on first need.

    The entries are checked here (a bad one stops start-up); a server is started
    only when the registry is asked for one of its tools (``ToolRegistry.defer``),
    so a command that runs no tool starts none. Their sessions close with the registry.
    A stdio server runs in ``containment`` (its ``sandbox`` table over ``defaults``),
    writing only in ``homes/<name>``.
    """
    entries = data.get("mcp_servers", []) if isinstance(data, dict) else []
    if not isinstance(entries, list):
        raise ConfigurationError(f"tools file {source}: mcp_servers must be a list of tables")
    seen: set[str] = set()
    sessions = McpSessions()
    registry.on_close(sessions.close)
    for index, entry in enumerate(entries):
        try:
            server = parse_server(entry, defaults or Limits())
        except ValueError as exc:
            raise ConfigurationError(f"tools file {source}: mcp_servers[{index}]: {exc}") from None
        if server.name in seen:
            raise ConfigurationError(f"tools file {source}: two MCP servers named {server.name!r}")
        seen.add(server.name)
        if containment is not None and homes is not None and server.command:
            server = replace(server, containment=containment, home=str(homes / server.name))
        registry.defer(
            str(server),
            functools.partial(_offers, server.prefix),
            functools.partial(discover, server, sessions),
        )


def _offers(prefix: str, name: str) -> bool:
    """May the server with this prefix offer a tool of this name?"""
    return name.startswith(prefix)


def parse_server(entry: Any, defaults: Limits | None = None) -> McpServer:
    if not isinstance(entry, dict):
        raise ValueError("each MCP server must be a table (object)")
    unknown = sorted(set(entry) - _SERVER_KEYS)
    if unknown:
        raise ValueError(f"unknown keys {unknown}; allowed: {sorted(_SERVER_KEYS)}")
    name = entry.get("name")
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
        raise ValueError(
            "name must be 1-32 lowercase letters, digits or '_', starting with a letter"
        )
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise ValueError(f"MCP server {name!r}: give either command (stdio) or url (HTTP)")
    if command is not None and (
        not isinstance(command, list)
        or not command
        or not all(isinstance(c, str) and c for c in command)
    ):
        raise ValueError(f"MCP server {name!r}: command must be a non-empty list of strings")
    if url is not None:
        _check_url(name, url, entry.get("allowed_hosts", list(LOOPBACK)))
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError(f"MCP server {name!r}: env must map names to strings")
    prefix = entry.get("prefix", f"{name}_")
    if not isinstance(prefix, str):
        raise ValueError(f"MCP server {name!r}: prefix must be a string")
    tools = entry.get("tools", {})
    if not isinstance(tools, dict):
        raise ValueError(f"MCP server {name!r}: tools must be a table of tool names")
    for tool, options in tools.items():
        _check_tool_options(name, tool, options)
    cwd = entry.get("cwd")
    grant = None
    if "sandbox" in entry:
        if url is not None:
            raise ValueError(
                f"MCP server {name!r}: sandbox options are for a stdio server (command);"
                " an HTTP server runs no process here"
            )
        try:
            grant = parse_grant(entry["sandbox"], defaults or Limits())
        except ContainmentError as exc:
            raise ValueError(f"MCP server {name!r}: sandbox: {exc}") from None
    return McpServer(
        name=name,
        command=tuple(command or ()),
        url=url or "",
        env=dict(env),
        cwd=str(cwd) if cwd is not None else None,
        prefix=prefix,
        timeout=_timeout(name, entry.get("timeout_seconds", DEFAULT_TIMEOUT)),
        tools=tools,
        grant=grant if grant is not None else Grant(defaults or Limits()),
    )


def _check_url(name: str, url: Any, allowed: Any) -> None:
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"MCP server {name!r}: url must be an http(s) URL")
    if not isinstance(allowed, list) or not all(isinstance(h, str) for h in allowed):
        raise ValueError(f"MCP server {name!r}: allowed_hosts must be a list of host names")
    host = (urlsplit(url).hostname or "").lower()
    if host not in {h.lower() for h in allowed}:
        raise ValueError(
            f"MCP server {name!r}: host {host!r} is not in allowed_hosts {allowed}"
            " (loopback only unless the file allows more)"
        )


def _check_tool_options(server: str, tool: Any, options: Any) -> None:
    if not isinstance(options, dict):
        raise ValueError(f"MCP server {server!r}: tools.{tool} must be a table")
    unknown = sorted(set(options) - _TOOL_KEYS)
    if unknown:
        raise ValueError(f"MCP server {server!r}: tools.{tool}: unknown keys {unknown}")
    if "effect" in options and options["effect"] not in {e.value for e in Effect}:
        raise ValueError(
            f"MCP server {server!r}: tools.{tool}: effect must be one of "
            f"{sorted(e.value for e in Effect)}"
        )
    if "timeout_seconds" in options:
        _timeout(server, options["timeout_seconds"])


def _timeout(server: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= MAX_TIMEOUT
    ):
        raise ValueError(f"MCP server {server!r}: timeout_seconds must be in (0, {MAX_TIMEOUT:g}]")
    return float(value)


def discover(server: McpServer, sessions: McpSessions) -> list[McpTool]:
    """List the server's tools on its session (started now), as turnlog tools; or refuse."""
    try:
        held = sessions.acquire(server)
        listed = sessions.run(_list, held, START_TIMEOUT)
    except ServerUnavailable as exc:
        raise ConfigurationError(str(exc)) from None
    except TimeoutError:
        late = f"{server} did not list its tools within {START_TIMEOUT:g}s"
        raise ConfigurationError(late) from None
    except Exception as exc:  # every way of not answering is refused, with its cause
        raise ConfigurationError(f"{server} could not list its tools: {describe(exc)}") from None
    return _confined(server, _tools(server, listed, sessions))


def _confined(server: McpServer, tools: list[McpTool]) -> list[McpTool]:
    """All the tools when the server runs sandboxed (or the sandbox is off); where the host
    cannot sandbox, only those that change nothing, as for command tools."""
    if not server.home or not server.containment.enabled:
        return tools
    host = check_host(server.containment)
    if host.ok:
        return tools
    kept = [t for t in tools if t.spec.effect is not Effect.SIDE_EFFECTING]
    left_out = sorted(t.spec.name for t in tools if t not in kept)
    log.warning(
        "%s runs unconfined: no sandbox on this host (%s); side-effecting tools left out: %s",
        server,
        host.reason,
        ", ".join(left_out) or "none",
    )
    return kept


class _RawListing(BaseModel):
    """A tools/list answer read as plain JSON, so a tool without a schema can be named."""

    model_config = ConfigDict(extra="allow")
    tools: list[dict[str, Any]]
    nextCursor: str | None = None


async def _list(session: Any) -> list[dict[str, Any]]:
    from mcp.types import ClientRequest, ListToolsRequest, PaginatedRequestParams

    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        request = ClientRequest(ListToolsRequest(params=params))
        listing = await session.send_request(request, _RawListing)
        tools += listing.tools
        cursor = listing.nextCursor
        if not cursor:
            return tools


def _tools(
    server: McpServer, listed: Sequence[dict[str, Any]], sessions: McpSessions
) -> list[McpTool]:
    names = [str(t.get("name", "")) for t in listed]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise ConfigurationError(f"{server} lists two tools named {doubled[0]!r}")
    unknown = sorted(set(server.tools) - set(names))
    if unknown:
        raise ConfigurationError(
            f"{server}: the tools file names tools it does not list: {unknown}"
        )
    return [_tool(server, entry, sessions) for entry in listed]


def _tool(server: McpServer, entry: dict[str, Any], sessions: McpSessions) -> McpTool:
    remote = str(entry.get("name", ""))
    name = server.prefix + remote
    if not TOOL_NAME.fullmatch(name):
        raise ConfigurationError(
            f"{server}: tool {remote!r} would be offered as {name!r}, not 1-64 letters, "
            "digits, '_' or '-'"
        )
    schema = entry.get("inputSchema")
    if schema is None:
        raise ConfigurationError(f"{server}: tool {remote!r} has no input schema (inputSchema)")
    try:
        check_parameters_schema(schema)
    except ValueError as exc:
        raise ConfigurationError(f"{server}: tool {remote!r}: input schema: {exc}") from None
    options = server.tools.get(remote, {})
    description = entry.get("description") or entry.get("title") or f"{remote} ({server.name})"
    return McpTool(
        spec=ToolSpec(name, str(description), dict(schema), _effect(options, entry)),
        server=server,
        remote_name=remote,
        sessions=sessions,
        timeout=float(options.get("timeout_seconds", server.timeout)),
    )


def _effect(options: dict[str, Any], entry: dict[str, Any]) -> Effect:
    """The file's effect, else the annotations', else side_effecting."""
    if "effect" in options:
        return Effect(options["effect"])
    annotations = entry.get("annotations") or {}
    if isinstance(annotations, dict):
        if annotations.get("readOnlyHint") is True:
            return Effect.READ_ONLY
        if annotations.get("idempotentHint") is True:
            return Effect.IDEMPOTENT
    return Effect.SIDE_EFFECTING
