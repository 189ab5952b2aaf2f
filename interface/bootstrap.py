"""The composition root: the one place that builds a process's parts.

``build_process(settings, role)`` is how every process is put together —
``serve`` (each role), ``worker``, ``projections run``, ``check`` and the
one-shot CLI commands. ``Process.start()`` finds the database, prepares the
namespace under the bootstrap lock (schema, then the application's tables),
wires the runtime with its providers and tools, and adds what the role runs:
the process's one log follower, its read models, the projection runners and
the worker. ``stop()`` takes them down in reverse order.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from turnlog.application.collector import freeze_start_up
from turnlog.application.errors import ConfigurationError
from turnlog.application.execution.leases import LEASES_KEPT
from turnlog.application.execution.loop import Executor
from turnlog.application.execution.worker import OpenTurnRef, Worker
from turnlog.application.log_context import bound
from turnlog.application.observer import Observer
from turnlog.application.providers.openai_compatible import OpenAIConfig, OpenAIProvider
from turnlog.application.providers.plugins import (
    ProviderContext,
    entry_point_tool_modules,
    plugin_providers,
)
from turnlog.application.providers.port import FixtureProvider, Provider, ProviderRegistry
from turnlog.application.runtime import Runtime
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings, split_names
from turnlog.application.store import database
from turnlog.application.store.follower import LogFollower
from turnlog.application.tools.builtin import builtin_tools
from turnlog.application.tools.command import (
    CommandTool,
    file_sandbox_options,
    load_tools_file,
    read_tools_file,
    shell_tool,
)
from turnlog.application.tools.containment import Containment, SandboxOptions, check_host
from turnlog.application.tools.mcp_servers import add_mcp_tools
from turnlog.application.tools.port import Tool, ToolRegistry
from turnlog.application.tools.processes import unsupported_reason
from turnlog.application.tools.python import PythonTool, load_modules, module_names
from turnlog.domain.turns import Effect
from turnlog.interface.roles import Role
from turnlog.interface.tracing import build_tracer
from turnlog.projections import ProjectionSupervisor, ReadModels

log = logging.getLogger("turnlog.serve")

# Pooled connections a worker process needs besides one per running turn (the
# API's requests, the read models, the follower's reads).
POOL_HEADROOM = 6


def worker_id() -> str:
    """host:pid:random — unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def open_sessions(
    settings: Settings, db: database.Database, *, owns_schema: bool = True
) -> Sessions:
    """Create the namespace (idempotently, under a lock) and its Sessions application.

    Only what is missing is created; an events table of an older version is
    migrated only when ``owns_schema`` (``application.store.recorder``).
    """
    with database.bootstrap_lock(db) as conn:
        database.create_schema(conn, settings.namespace)
        # CREATE_TABLE=y, under the lock: processes starting together never race on CREATE.
        return Sessions(
            env=database.library_env(db, settings, create_table=True, owns_schema=owns_schema),
            snapshot_interval=settings.snapshot_interval,
            riding=settings.durability == "by_class",
            idempotency_window=settings.idempotency_window,
        )


def build_tools(settings: Settings) -> ToolRegistry:
    """Built-ins, the shell tool when enabled, and the tools file (a bad file stops start-up).

    Every tool process runs in the sandbox (docs/containment.md). Where the host
    cannot make one, the side-effecting process tools are left out, saying why;
    ``TURNLOG_SANDBOX=off`` runs them all unconfined, with a warning at every start.
    """
    tools = ToolRegistry(builtin_tools())
    modules = python_tool_modules(settings)
    data = read_tools_file(settings.tools_file) if settings.tools_file is not None else {}
    options = (
        file_sandbox_options(settings.tools_file, data)
        if settings.tools_file is not None
        else SandboxOptions()
    )
    containment = Containment(enabled=settings.sandbox == "on")
    spawning: list[Tool] = []
    if settings.shell_tool or settings.tools_file is not None or modules:
        reason = unsupported_reason()
        if reason:
            raise ConfigurationError(reason)
    if settings.shell_tool:
        grant = options.grant("shell")
        spawning.append(
            shell_tool(
                settings.shell_timeout,
                settings.tool_output_bytes,
                grant=grant,
                containment=containment,
            )
        )
    if settings.tools_file is not None:
        spawning += load_tools_file(
            settings.tools_file, settings.tool_output_bytes, containment, options
        )
    python_tools = load_modules(
        modules, settings.tool_output_bytes, containment, options, tool_search_path(settings)
    )
    _check_sandbox_names(settings, options, tools, [*spawning, *python_tools])
    for tool in contained([*spawning, *python_tools], containment):
        try:
            tools.add(tool)
        except ValueError as exc:
            if not isinstance(tool, PythonTool):
                raise ConfigurationError(f"tools file {settings.tools_file}: {exc}") from None
            where = f"{tool.declaration.module}.{tool.declaration.function}"
            raise ConfigurationError(f"Python tool {where}: {exc}") from None
    if settings.tools_file is not None:
        # Checked now; each MCP server starts when its tools are first needed.
        homes = settings.data_dir.resolve() / "mcp" / settings.namespace
        add_mcp_tools(tools, data, settings.tools_file, containment, options.defaults, homes)
    return tools


def sandbox_state(settings: Settings) -> str:
    """What /readyz and the console say of tool processes here."""
    if settings.sandbox == "off":
        return "off: tool processes run unconfined (TURNLOG_SANDBOX=off)"
    host = check_host()
    return "on" if host.ok else f"unavailable: {host.reason}"


def contained(spawning: list[Tool], containment: Containment) -> list[Tool]:
    """The process tools this host may offer: all when sandboxed (or the sandbox is off),
    and only those that change nothing when the host cannot sandbox."""
    if not spawning:
        return spawning
    if not containment.enabled:
        log.warning(
            "TURNLOG_SANDBOX=off: tool processes run unconfined, as this process's user, with"
            " its file system and network; a tool can read and change anything this process can"
        )
        return spawning
    host = check_host(containment)
    if host.ok:
        return spawning
    left_out = sorted(t.spec.name for t in spawning if t.spec.effect == Effect.SIDE_EFFECTING)
    kept = [t for t in spawning if t.spec.name not in left_out]
    log.warning(
        "no sandbox on this host (%s): side-effecting tools left out: %s; the others (%s) run"
        " unconfined. Fix the host (`turnlog sandboxes check`), or set TURNLOG_SANDBOX=off"
        " to run them all unconfined",
        host.reason,
        ", ".join(left_out) or "none",
        ", ".join(t.spec.name for t in kept) or "none",
    )
    return [_unconfined(t) for t in kept]


def _unconfined(tool: Tool) -> Tool:
    off = Containment(enabled=False)
    if isinstance(tool, CommandTool):
        prober = tool.prober and replace(tool.prober, containment=off)
        return replace(tool, containment=off, prober=prober)
    if isinstance(tool, PythonTool):
        return replace(tool, containment=off)
    return tool


def _check_sandbox_names(
    settings: Settings, options: SandboxOptions, builtins: ToolRegistry, spawning: list[Tool]
) -> None:
    """Each ``[sandbox.tools.NAME]`` must name a tool that runs as a process here."""
    names = {t.spec.name for t in spawning}
    for name in options.per_tool:
        if name in names:
            continue
        if builtins.get(name) is not None:
            why = "runs inside turnlog, not as a process: it can have no sandbox options"
        else:
            why = "names no tool of this process (shell off, or no such tool)"
        raise ConfigurationError(
            f"tools file {settings.tools_file}: [sandbox.tools.{name}]: tool {name!r} {why}"
        )


def tool_search_path(settings: Settings) -> list[Path]:
    """Where Python tool modules are looked for first: the tools file's folder, then the cwd."""
    first = [settings.tools_file.resolve().parent] if settings.tools_file is not None else []
    return [*first, Path.cwd()]


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
    return module_names(settings.tool_modules, [*listed, *entry_point_tool_modules()])


def approval_tools(settings: Settings, tools: ToolRegistry) -> frozenset[str]:
    """TURNLOG_APPROVAL_TOOLS as names; a name no tool has is refused at start-up."""
    names = split_names(settings.approval_tools or "")
    # Looked up by name: only an MCP server that may offer one of them is started.
    unknown = sorted(n for n in set(names) if tools.get(n) is None)
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
    built_in: list[Provider] = [FixtureProvider(), OpenAIProvider(openai, tools.specs)]
    context = ProviderContext(tool_specs=tools.specs, default_model=settings.model)
    plugins = plugin_providers(settings.provider_modules, context, [p.name for p in built_in])
    registry = ProviderRegistry([*built_in, *plugins], default=settings.provider)
    if settings.provider not in registry.names():
        raise ConfigurationError(
            f"TURNLOG_PROVIDER names {settings.provider!r}; the providers are {registry.names()}"
        )
    return registry


def build_runtime(
    settings: Settings,
    *,
    leases_kept: int = LEASES_KEPT,
    load_tools: bool = True,
    owns_schema: bool = True,
) -> Runtime:
    """The application with its database, tools and providers (``Process.start`` calls it).

    ``leases_kept``: lease connections kept between leases (a worker: its concurrency).
    ``load_tools``: list every MCP server's tools now (starting the servers), so a
    server that cannot start stops the process here; False leaves that to the
    first use, so a command that runs no tool starts no server.
    ``owns_schema``: may migrate the namespace's tables (not a one-shot command).
    """
    tools = build_tools(settings)  # before the database: a bad tools file fails fast
    try:
        if load_tools:
            tools.load()
        providers = build_providers(settings, tools)
        db = database.locate(settings)
        sessions = open_sessions(settings, db, owns_schema=owns_schema)
    except BaseException:
        tools.close()
        raise
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
        tracer=build_tracer(),
    )
    return Runtime(
        settings=settings, db=db, sessions=sessions, executor=executor, leases_kept=leases_kept
    )


class OpenTurnsSource:
    """The worker's slow source of work: the open-turns read model, paged."""

    def __init__(self, read_models: ReadModels) -> None:
        self.read_models = read_models

    def catch_up(self, timeout: float) -> bool:
        head = self.read_models.events.head()
        return self.read_models.wait_for(head, timeout, names=["open_turns"])

    def open_turns(self, limit: int) -> Sequence[OpenTurnRef]:
        refs: list[OpenTurnRef] = []
        cursor = None
        while len(refs) < limit:
            rows, cursor = self.read_models.list_open_turns(
                None, min(limit - len(refs), 500), cursor
            )
            refs += [
                OpenTurnRef(str(r["session_id"]), str(r["turn_id"]), str(r["state"])) for r in rows
            ]
            if not cursor:
                break
        return refs


@dataclass
class Process:
    """The parts of one turnlog process; built only by ``build_process``.

    ``role`` is what the process runs: a ``serve`` role, or ``None`` for a
    one-shot command (the runtime and, when asked, the read models).
    """

    settings: Settings
    role: Role | None
    worker_concurrency: int = 4
    only: Sequence[str] | None = None  # the read models a projections process runs (all)
    batch_size: int = 500
    poll_interval: float = 0.5
    # Told about every model call, tool call and turn this process runs (metrics).
    observer: Observer | None = None
    runtime: Runtime | None = None
    read_models: ReadModels | None = None
    # The one LISTEN connection of the process, and its one reader of the log's tail.
    follower: LogFollower | None = None
    supervisor: ProjectionSupervisor | None = None
    worker: Worker | None = None
    # May migrate the namespace's tables: every serve role, and ``db init``.
    owns_schema: bool | None = None  # None: when it has a role

    def start(self) -> Process:
        """Build and start what the role needs; blocking. Raises when the database is down."""
        if self.runtime is not None:
            return self
        runs_worker = self.role is not None and self.role.runs_worker
        kept = max(LEASES_KEPT, self.worker_concurrency) if runs_worker else LEASES_KEPT
        # A serve role lists its MCP tools now (a server that is down stops it); a
        # one-shot command only when it needs them (db status, check start none).
        load = self.role is not None
        owns = self.role is not None if self.owns_schema is None else self.owns_schema
        built = build_runtime(self.settings, leases_kept=kept, load_tools=load, owns_schema=owns)
        self.runtime = built
        try:
            self._start_rest(self.runtime)
        except BaseException:
            self.stop(drain_timeout=0)
            raise
        return self

    def _start_rest(self, runtime: Runtime) -> None:
        if self.observer is not None:
            runtime.executor.observer = self.observer
        role = self.role
        if role is None:
            return  # a one-shot command: read models on first use (``reads``)
        self.follower = LogFollower(runtime.sessions, runtime.db)
        runtime.sessions.news.attach(self.follower)
        self.follower.start()
        reads = self.reads()
        if role.runs_projections:
            self.supervisor = ProjectionSupervisor(
                self.settings,
                runtime.db,
                self.only,
                sessions=runtime.sessions,
                batch_size=self.batch_size,
                poll_interval=self.poll_interval,
                follower=self.follower,
            )
            self.supervisor.start()
        if role.runs_worker:
            self.worker = Worker(
                runtime,
                OpenTurnsSource(reads),
                self.worker_concurrency,
            )
            summary = self.worker.start()
            with bound(worker_id=self.worker.worker_id):
                log.info("worker %s started: %s", self.worker.worker_id, summary)

    def reads(self) -> ReadModels:
        """The read models (made on first use); they share the runtime's connection pool."""
        if self.runtime is None:
            raise RuntimeError("the process is not started")
        if self.read_models is None:
            runtime = self.runtime
            self.read_models = ReadModels(runtime.db, self.settings, sessions=runtime.sessions)
        return self.read_models

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop in reverse order: worker (drained), projections, follower, then the runtime."""
        if self.worker is not None:
            if not self.worker.stop(drain_timeout=drain_timeout):
                log.warning("a turn was still busy after %.0fs; left for recovery", drain_timeout)
            self.worker = None
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        if self.follower is not None:
            self.follower.stop()
            if self.runtime is not None:
                self.runtime.sessions.news.detach()
            self.follower = None
        self.read_models = None
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None

    def checks(self) -> dict[str, bool]:
        """What /readyz reports besides the database."""
        checks = {"started": self.runtime is not None}
        if self.role is not None and self.role.runs_projections:
            checks["projections"] = _running(self.supervisor)
        if self.role is not None and self.role.runs_worker:
            checks["worker"] = self.worker is not None
        return checks


def _running(supervisor: ProjectionSupervisor | None) -> bool:
    """Every runner of this process is leading or standing by (none is failing)."""
    if supervisor is None:
        return False
    runners = supervisor.runners()
    return bool(runners) and all(r["state"] in ("active", "standby") for r in runners)


# The collector's thresholds in a long-running process (serve, worker, projections run). A turn
# allocates tens of thousands of short-lived objects (events, rows, requests); with the defaults
# (a young collection every 700 allocations, and full ones that rescan every module) collections
# took about a seventh of these processes' CPU (serve --split at 16 clients, interleaved A/B:
# Python CPU per turn 0.95x with these thresholds alone, 0.84x with the freeze too). Cycles are
# still collected, in larger batches.
LONG_RUNNING_GC = (50_000, 20, 10)


def tune_collector() -> None:
    """For a long-running process, once its modules are loaded: collect less often.

    What start-up made is frozen (later collections skip it), and the young
    generation is collected every ``LONG_RUNNING_GC[0]`` allocations.
    """
    freeze_start_up()
    gc.set_threshold(*LONG_RUNNING_GC)


def build_process(
    settings: Settings,
    role: Role | str | None,
    *,
    worker_concurrency: int = 4,
    only: Sequence[str] | None = None,
    batch_size: int = 500,
    poll_interval: float = 0.5,
) -> Process:
    """The one way a process is put together: nothing is opened until ``start()``.

    ``role`` None is a one-shot command: the runtime, and the read models
    on first use. A serve role adds the follower and the read
    models, and then the projection runners (``only`` some of them) and the
    worker as the role runs them. Unless ``TURNLOG_POOL_MAX_OVERFLOW`` is set,
    a worker's pool grows to its concurrency plus ``POOL_HEADROOM``.
    """
    role = None if role is None else Role(role)
    if (
        role is not None
        and role.runs_worker
        and "pool_max_overflow" not in settings.model_fields_set
    ):
        # Each running turn takes a pooled connection at every step: a pool
        # smaller than the worker's concurrency makes turns queue for one.
        wanted = worker_concurrency + POOL_HEADROOM - settings.pool_size
        if wanted > settings.pool_max_overflow:
            settings = settings.model_copy(update={"pool_max_overflow": wanted})
    return Process(
        settings,
        role,
        worker_concurrency=worker_concurrency,
        only=only,
        batch_size=batch_size,
        poll_interval=poll_interval,
    )
