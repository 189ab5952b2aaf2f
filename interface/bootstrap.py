"""The composition root: the one place that knows every concrete class.

``build_runtime(settings)`` finds the database, prepares the namespace under
the bootstrap lock (schema, then the application's tables), and wires the
application with its providers and tools.
"""

from __future__ import annotations

import os
import socket
import uuid

from turnlog.application import database
from turnlog.application.command_tools import add_declared_tools, read_tools_file, shell_tool
from turnlog.application.errors import ConfigurationError
from turnlog.application.execution import Executor
from turnlog.application.mcp_tools import add_mcp_tools
from turnlog.application.openai_provider import OpenAIConfig, OpenAIProvider
from turnlog.application.processes import unsupported_reason
from turnlog.application.providers import FixtureProvider, ProviderRegistry
from turnlog.application.python_tools import load_modules, module_names
from turnlog.application.runtime import Runtime
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings, split_names
from turnlog.application.tools import ToolRegistry, builtin_tools


def worker_id() -> str:
    """host:pid:random — unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def open_sessions(settings: Settings, db: database.Database) -> Sessions:
    """Create the namespace (idempotently, under a lock) and its Sessions application."""
    with database.bootstrap_lock(db) as conn:
        database.create_schema(conn, settings.namespace)
        # Constructing with CREATE_TABLE=y creates the tables; doing it under
        # the lock keeps processes that start together from racing on CREATE.
        return Sessions(
            env=database.library_env(db, settings, create_table=True),
            snapshot_interval=settings.snapshot_interval,
        )


def build_tools(settings: Settings) -> ToolRegistry:
    """Built-ins, the shell tool when enabled, and the tools file (a bad file stops start-up)."""
    tools = ToolRegistry(builtin_tools())
    modules = python_tool_modules(settings)
    if settings.shell_tool or settings.tools_file is not None or modules:
        reason = unsupported_reason()
        if reason:
            raise ConfigurationError(reason)
    if settings.shell_tool:
        tools.add(shell_tool(settings.shell_timeout, settings.tool_output_bytes))
    if settings.tools_file is not None:
        add_declared_tools(tools, settings.tools_file, settings.tool_output_bytes)
        # Each MCP server is started once here to list its tools (refused if it cannot).
        add_mcp_tools(tools, read_tools_file(settings.tools_file), settings.tools_file)
    for tool in load_modules(modules, settings.tool_output_bytes):
        try:
            tools.add(tool)
        except ValueError as exc:
            where = f"{tool.declaration.module}.{tool.declaration.function}"
            raise ConfigurationError(f"Python tool {where}: {exc}") from None
    return tools


def python_tool_modules(settings: Settings) -> list[str]:
    """TURNLOG_TOOL_MODULES, then the tools file's ``modules`` list."""
    listed: list[str] = []
    if settings.tools_file is not None:
        data = read_tools_file(settings.tools_file)
        listed = data.get("modules", []) if isinstance(data, dict) else []
        if not isinstance(listed, list) or not all(isinstance(m, str) for m in listed):
            raise ConfigurationError(
                f"tools file {settings.tools_file}: modules must be a list of module names"
            )
    return module_names(settings.tool_modules, listed)


def approval_tools(settings: Settings, tools: ToolRegistry) -> frozenset[str]:
    """TURNLOG_APPROVAL_TOOLS as names; a name no tool has is refused at start-up."""
    names = split_names(settings.approval_tools or "")
    unknown = sorted(set(names) - set(tools.names()))
    if unknown:
        raise ConfigurationError(f"TURNLOG_APPROVAL_TOOLS names unknown tools: {unknown}")
    return frozenset(names)


def build_providers(settings: Settings, tools: ToolRegistry) -> ProviderRegistry:
    """Every provider a session may name; the OpenAI one connects on first use only."""
    openai = OpenAIConfig(
        base_url=settings.openai_base_url,
        api_key=settings.openai_api_key,
        default_model=settings.model,
        timeout=settings.openai_timeout,
        max_retries=settings.openai_max_retries,
        backoff=settings.openai_retry_backoff,
        max_delay=settings.openai_retry_max_delay,
    )
    return ProviderRegistry(
        [FixtureProvider(), OpenAIProvider(openai, tools.specs)], default=settings.provider
    )


def build_runtime(settings: Settings) -> Runtime:
    """Everything a turnlog process needs, built once at start-up."""
    tools = build_tools(settings)  # before the database: a bad tools file fails fast
    providers = build_providers(settings, tools)
    db = database.locate(settings)
    sessions = open_sessions(settings, db)
    sessions.default_deadline_seconds = settings.turn_deadline_seconds
    executor = Executor(
        sessions=sessions,
        providers=providers,
        tools=tools,
        worker_id=worker_id(),
        sandbox_root=settings.sandbox_root,
        max_steps=settings.max_steps,
        namespace=settings.namespace,
        approval_tools=approval_tools(settings, tools),
    )
    return Runtime(settings=settings, db=db, sessions=sessions, executor=executor)
