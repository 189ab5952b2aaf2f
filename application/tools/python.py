"""Tools written in Python: ``@turnlog.tool`` on a typed function.

    @turnlog.tool(effect="read_only", timeout=10)
    def word_count(path: str, min_length: int = 1) -> dict[str, int]:
        \"\"\"Count the words of a file in the sandbox.\"\"\"

The parameters' JSON schema comes from the type hints (through pydantic), the
description from the docstring. Modules holding such functions are named in
``TURNLOG_TOOL_MODULES`` (comma-separated) or in the tools file's ``modules``
list; every process imports them at start-up, and a module that cannot be
imported, a function without type hints, or two tools with one name stop
start-up with the cause named.

Where they run: never in the worker's process. Each call is a fresh
``python -m turnlog.application.tools.python_runner`` in the session's sandbox
(the OS sandbox of application/tools/containment.py, with this interpreter and
every ``sys.path`` directory visible read-only, so the modules and their
imports load as they did here), its own process group, started like a
command tool's process (its pid and start time recorded before it runs), so
a tool that overruns its timeout is killed with its group and cannot wedge
the worker, and a worker killed mid-call leaves the same record as for a
command tool: recovery re-runs a ``read_only`` or ``idempotent`` tool and interrupts the turn for a
``side_effecting`` one (the outcome is unknown) — unless the tool declares a
``probe`` (and probes are on): a module-level function
``probe(arguments: dict, idempotency_key: str, pre_state: dict) -> dict``
returning ``{"answer": "applied", "result": …}``, ``{"answer": "not_applied"}``
or ``{"answer": "unknown", "note": …}``, run the same way in a process of
its own, bounded by ``probe_timeout`` (application/tools/probes.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, create_model

from turnlog.application.errors import ConfigurationError
from turnlog.application.tools.containment import Containment, Grant, SandboxOptions
from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.port import ToolError, ToolSpec, check_arguments
from turnlog.application.tools.probes import (
    DEFAULT_PROBE_TIMEOUT,
    ProbeReport,
    parse_answer,
    report_from,
    unknown,
)
from turnlog.application.tools.processes import run_contained
from turnlog.domain.turns import Effect

F = TypeVar("F", bound=Callable[..., Any])
MARK = "__turnlog_tool__"
ARGUMENTS_ENV = "TURNLOG_TOOL_ARGUMENTS"
PRE_STATE_ENV = "TURNLOG_PROBE_PRE_STATE"
# The runner's last line of output: this marker, then the result as JSON. What
# the function itself prints can never be taken for its result.
RESULT_MARK = "\x1eturnlog-result "
DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 3600.0
EffectName = Literal["read_only", "idempotent", "side_effecting"]


@dataclass(frozen=True)
class Declaration:
    """What ``@tool`` attaches to a function."""

    spec: ToolSpec
    timeout: float
    module: str
    function: str
    probe: str = ""  # the probe function's qualified name in ``module`` ('' when none)
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    rerun_when_not_applied: bool = False


def tool(
    effect: EffectName = "side_effecting",
    timeout: float = DEFAULT_TIMEOUT,
    *,
    name: str | None = None,
    description: str | None = None,
    probe: Callable[..., Any] | None = None,
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
    rerun_when_not_applied: bool = False,
) -> Callable[[F], F]:
    """Offer a typed function as a tool; it is returned unchanged (still callable as is).

    ``effect`` decides recovery after a crash mid-call: ``read_only`` and
    ``idempotent`` tools are run again, ``side_effecting`` ones (the default)
    are never repeated behind anyone's back. ``probe``, a module-level
    function of the same module, settles a call left in flight from evidence.
    """
    if probe is not None and not callable(probe):
        raise TypeError("probe must be a function")
    if isinstance(probe_timeout, bool) or not 0 < float(probe_timeout) <= MAX_TIMEOUT:
        raise ValueError(f"probe_timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds")
    if effect not in ("read_only", "idempotent", "side_effecting"):
        raise ValueError(f"effect must be read_only, idempotent or side_effecting, not {effect!r}")
    if isinstance(timeout, bool) or not 0 < float(timeout) <= MAX_TIMEOUT:
        raise ValueError(f"timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds")

    def declare(function: F) -> F:
        spec = ToolSpec(
            name or function.__name__,
            description or _description(function),
            parameters_schema(function),
            Effect(effect),
        )
        setattr(
            function,
            MARK,
            Declaration(
                spec,
                float(timeout),
                function.__module__,
                function.__qualname__,
                _probe_name(probe, function),
                float(probe_timeout),
                bool(rerun_when_not_applied),
            ),
        )
        return function

    return declare


def _probe_name(probe: Callable[..., Any] | None, function: Callable[..., Any]) -> str:
    if probe is None:
        return ""
    if getattr(probe, "__module__", None) != function.__module__ or "<" in probe.__qualname__:
        raise TypeError(
            f"tool {function.__qualname__}: its probe must be a module-level function"
            " of the same module"
        )
    return str(probe.__qualname__)


def _description(function: Callable[..., Any]) -> str:
    text = inspect.getdoc(function)
    if not text:
        raise TypeError(
            f"tool {function.__qualname__}: a docstring is needed (it is the description)"
        )
    return text.strip()


def arguments_model(function: Callable[..., Any]) -> type[BaseModel]:
    """A pydantic model of the function's parameters; every parameter must have a type hint."""
    signature = inspect.signature(function)
    hints = inspect.get_annotations(function, eval_str=True)
    fields: dict[str, Any] = {}
    for parameter in signature.parameters.values():
        if parameter.kind in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
            parameter.POSITIONAL_ONLY,
        ):
            raise TypeError(
                f"tool {function.__qualname__}: parameter {parameter.name!r} must be named"
            )
        if parameter.name not in hints:
            raise TypeError(
                f"tool {function.__qualname__}: parameter {parameter.name!r} has no type hint"
            )
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (hints[parameter.name], default)
    config = ConfigDict(extra="forbid")
    return create_model(f"{function.__name__}_arguments", __config__=config, **fields)


def parameters_schema(function: Callable[..., Any]) -> dict[str, Any]:
    schema = arguments_model(function).model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("required", [])
    return schema


@dataclass(frozen=True)
class PythonTool:
    """A ``@tool`` function, run in a process of its own in the session's sandbox."""

    declaration: Declaration
    python_path: tuple[str, ...]
    output_limit: int = 16 * 1024
    grant: Grant = field(default_factory=Grant)
    containment: Containment = field(default_factory=Containment)

    @property
    def spec(self) -> ToolSpec:
        return self.declaration.spec

    @property
    def prober(self) -> PythonProber | None:
        if not self.declaration.probe:
            return None
        return PythonProber(self.declaration, self.python_path, self.grant, self.containment)

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        check_arguments(self.spec, arguments)
        declared = self.declaration
        env = context.trace_env() | {
            "PATH": os.environ.get("PATH", os.defpath),
            "LANG": "C.UTF-8",
            "HOME": str(context.sandbox),
            "PYTHONPATH": os.pathsep.join(runner_path(self.python_path)),
            "TURNLOG_SESSION_ID": context.session_id,
            "TURNLOG_CALL_ID": context.call_id,  # the model's id, unique only within the session
            "TURNLOG_IDEMPOTENCY_KEY": context.idempotency_key,
            "TURNLOG_ATTEMPT": str(context.attempt),
            ARGUMENTS_ENV: json.dumps(arguments),
        }
        result = run_python(
            self,
            [declared.module, declared.function],
            context,
            env,
            timeout=declared.timeout,
            output_limit=max(self.output_limit, 64 * 1024),
            report=context.report_process,
        )
        if result.timed_out:
            raise ToolError(
                f"{self.spec.name}: timed out after {declared.timeout:g}s; its process was killed"
            )
        return _answer(
            self.spec.name, result.exit_code, result.stdout, result.stderr, result.truncated
        )


@dataclass(frozen=True)
class PythonProber:
    """A Python tool's probe function, run like the tool in a process of its own."""

    declaration: Declaration
    python_path: tuple[str, ...]
    grant: Grant = field(default_factory=Grant)
    containment: Containment = field(default_factory=Containment)

    @property
    def rerun_when_not_applied(self) -> bool:
        return self.declaration.rerun_when_not_applied

    def prepare(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        return {}

    def probe(
        self, arguments: dict[str, Any], context: ToolContext, pre_state: dict[str, Any]
    ) -> ProbeReport:
        declared = self.declaration
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "LANG": "C.UTF-8",
            "HOME": str(context.sandbox),
            "PYTHONPATH": os.pathsep.join(runner_path(self.python_path)),
            "TURNLOG_SESSION_ID": context.session_id,
            "TURNLOG_CALL_ID": context.call_id,
            "TURNLOG_IDEMPOTENCY_KEY": context.idempotency_key,
            "TURNLOG_ATTEMPT": str(context.attempt),
            ARGUMENTS_ENV: json.dumps(arguments),
            PRE_STATE_ENV: json.dumps(pre_state),
        }
        result = run_python(
            self,
            ["--probe", declared.module, declared.probe],
            context,
            env,
            timeout=declared.probe_timeout,
            output_limit=64 * 1024,
            report=lambda process: None,  # a probe changes nothing: not recorded
        )
        if result.timed_out or result.exit_code != 0:
            code = None if result.timed_out else result.exit_code
            return parse_answer(code, result.stdout, result.stderr, declared.probe_timeout)
        printed = {"stdout": result.stdout[-1000:], "stderr": result.stderr[-1000:]}
        _, marked, text = result.stdout.rpartition(RESULT_MARK)
        try:
            answer = json.loads(text) if marked else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            return unknown("the probe returned no answer object", **printed)
        return report_from(answer, printed)


def _find(name: str, search: Sequence[Path]) -> None:
    """Put the first ``search`` folder holding module ``name`` on ``sys.path``, if it needs one."""
    top = name.split(".", 1)[0]
    if importlib.util.find_spec(top) is not None:
        return
    for folder in search:
        if (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file():
            sys.path.insert(0, str(folder.resolve()))
            importlib.invalidate_caches()
            return


def run_python(
    where: Any,
    args: list[str],
    context: ToolContext,
    env: dict[str, str],
    *,
    timeout: float,
    output_limit: int,
    report: Any,
) -> Any:
    """Run ``python_runner ARGS`` in the session's sandbox, as ``where`` (a tool or its
    prober: its containment, grant and import path) says."""
    argv = [sys.executable, "-m", "turnlog.application.tools.python_runner", *args]
    return run_contained(
        where.containment,
        argv,
        sandbox=context.sandbox,
        grant=where.grant,
        env=env,
        read_only=interpreter_paths(where.python_path),
        timeout=timeout,
        output_limit=output_limit,
        report=report,
    )


def interpreter_paths(python_path: tuple[str, ...]) -> list[Path]:
    """What a tool process must read to start this interpreter and import what it imports."""
    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent]
    paths += turnlog_paths()
    return paths + [Path(p) for p in python_path if p and os.path.isdir(p)]


def turnlog_paths() -> list[Path]:
    """turnlog's own package, where an editable install keeps it outside ``sys.path``.

    The package folder and what its links point at (the layer folders of a
    checkout), not the folder above them: a checkout also holds data
    (``.turnlog``) that a tool must not see.
    """
    import turnlog

    package = Path(turnlog.__file__).parent
    return [package] + [child.resolve() for child in package.iterdir() if child.is_symlink()]


def runner_path(python_path: tuple[str, ...]) -> tuple[str, ...]:
    """``python_path`` with the folder that holds the ``turnlog`` package last, if missing."""
    holder = [str(p.parent) for p in turnlog_paths()[:1]]
    return python_path + tuple(h for h in holder if h not in python_path)


def _answer(name: str, exit_code: int | None, stdout: str, stderr: str, truncated: bool) -> Any:
    if exit_code != 0:
        reason = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit code {exit_code}"
        raise ToolError(f"{name}: {reason}")
    if truncated:
        raise ToolError(f"{name}: its result is larger than the output limit")
    _, marked, text = stdout.rpartition(RESULT_MARK)
    try:
        if not marked:
            raise ValueError("no result")
        return json.loads(text)
    except ValueError:
        raise ToolError(f"{name}: it gave no JSON result; output: {stdout[-200:]!r}") from None


# ------------------------------------------------------------------ loading


def module_names(setting: str | None, from_file: Iterable[str] = ()) -> list[str]:
    names = [n.strip() for n in (setting or "").split(",") if n.strip()]
    return list(dict.fromkeys([*names, *from_file]))


def load_modules(
    names: Iterable[str],
    output_limit: int,
    containment: Containment | None = None,
    options: SandboxOptions | None = None,
    search: Sequence[Path] = (),
) -> list[PythonTool]:
    """Import each module and collect its ``@tool`` functions; refuse with the cause named.

    ``search``: folders to look in (the tools file's, then the working
    directory) for a module ``sys.path`` does not have: a module lies where
    the file naming it does, whichever way the process was started (the
    ``turnlog`` script puts its own folder, not the working directory, on
    ``sys.path``). Only a folder a module was found in is added, since a
    Python tool's process sees every folder of its path.
    """
    names = list(names)
    for name in names:
        _find(name, search)
    python_path = tuple(p or os.getcwd() for p in sys.path)
    containment = containment or Containment()
    options = options or SandboxOptions()
    tools: list[PythonTool] = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise ConfigurationError(
                f"tool module {name!r} cannot be imported: {type(exc).__name__}: {exc}"
            ) from None
        found = [
            getattr(value, MARK)
            for value in vars(module).values()
            if callable(value) and isinstance(getattr(value, MARK, None), Declaration)
        ]
        found = [d for d in found if d.module == module.__name__]
        if not found:
            raise ConfigurationError(f"tool module {name!r} has no @turnlog.tool function")
        tools += [
            PythonTool(d, python_path, output_limit, options.grant(d.spec.name), containment)
            for d in found
        ]
    return tools
