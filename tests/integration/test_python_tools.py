"""Python tools: ``@turnlog.tool`` functions, loaded at start-up, run in processes of their own.

The tool modules are written by each test into a directory on ``sys.path``;
the fixture provider calls the tools (``/tool NAME {json}``) through the
agent loop, and its reply carries what the tool returned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

import turnlog
from tests.api.conftest import eventually
from tests.conftest import ROOT, raw_events, turnlog_env
from turnlog.application.errors import ConfigurationError
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.application.tools.python import parameters_schema
from turnlog.domain.turns import Effect
from turnlog.interface.bootstrap import build_runtime, build_tools

SAMPLE = '''
from pathlib import Path
import time
import turnlog


@turnlog.tool(effect="read_only", timeout=20)
def word_count(path: str, min_length: int = 1) -> dict:
    """Count the words of a file in the sandbox."""
    words = [w for w in Path(path).read_text().split() if len(w) >= min_length]
    print("this goes to stderr, not into the result")
    return {"words": len(words)}


@turnlog.tool(effect="side_effecting", timeout=1)
def hang(seconds: float) -> str:
    """Sleep for longer than the timeout."""
    time.sleep(seconds)
    return "woke"


@turnlog.tool(effect="read_only", timeout=60)
def slow_read(seconds: float, marker: str) -> str:
    """Leave a mark, wait, then answer (a read_only call a test can kill mid-flight).

    The wait ends early once MARKER.release exists: a test lets the re-run go at once.
    """
    with open(marker, "a") as handle:
        handle.write("ran\\n")
    release = Path(marker + ".release")
    until = time.monotonic() + seconds
    while time.monotonic() < until and not release.exists():
        time.sleep(0.05)
    return "read"


@turnlog.tool(effect="side_effecting", timeout=60)
def slow_write(seconds: float, marker: str) -> str:
    """Wait, then write (a side-effecting call a test can kill mid-flight)."""
    time.sleep(seconds)
    with open(marker, "a") as handle:
        handle.write("wrote\\n")
    return "written"
'''


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "tool_modules"
    where.mkdir()
    (where / "sample_tools.py").write_text(SAMPLE)
    monkeypatch.syspath_prepend(str(where))
    return where


def write(where: Path, name: str, text: str) -> str:
    (where / f"{name}.py").write_text(textwrap.dedent(text))
    return name


@pytest.fixture
def python_runtime(settings: Settings, modules: Path) -> Iterator[Runtime]:
    rt = build_runtime(settings.model_copy(update={"tool_modules": "sample_tools"}))
    yield rt
    rt.close()


def ask(rt: Runtime, name: str, arguments: dict[str, Any]) -> str:
    session_id = rt.sessions.create_session(tools=rt.executor.tools.names()).session_id
    return rt.send(session_id, f"/tool {name} {json.dumps(arguments)}").turn.reply


def test_a_typed_function_becomes_a_tool_with_a_schema_and_a_description() -> None:
    @turnlog.tool(effect="idempotent", timeout=5)
    def book(room: str, nights: int, breakfast: bool = False) -> str:
        """Book a room (the booking id makes a repeat harmless)."""
        return room

    spec = book.__turnlog_tool__.spec  # type: ignore[attr-defined]
    assert (spec.name, spec.effect) == ("book", Effect.IDEMPOTENT)
    assert spec.description == "Book a room (the booking id makes a repeat harmless)."
    assert spec.parameters["required"] == ["room", "nights"]
    assert spec.parameters["additionalProperties"] is False
    assert spec.parameters["properties"]["nights"] == {"type": "integer"}
    assert book("blue", 2) == "blue"  # still a plain function


def test_a_function_without_type_hints_or_docstring_is_refused() -> None:
    def untyped(path):  # type: ignore[no-untyped-def]
        """No hints."""

    with pytest.raises(TypeError, match="parameter 'path' has no type hint"):
        parameters_schema(untyped)
    with pytest.raises(TypeError, match="docstring"):
        turnlog.tool()(lambda x: x)  # type: ignore[arg-type]


def test_a_python_tool_runs_in_the_sandbox_and_returns_its_result(
    python_runtime: Runtime, database: Database
) -> None:
    rt = python_runtime
    session_id = rt.sessions.create_session(tools=rt.executor.tools.names()).session_id
    sandbox = rt.settings.sandbox_root / str(session_id)
    sandbox.mkdir(parents=True, exist_ok=True)
    (sandbox / "text.txt").write_text("a bb ccc dddd")
    reply = rt.send(session_id, '/tool word_count {"path": "text.txt", "min_length": 2}').turn.reply
    assert reply == 'Tool word_count returned: {"words": 3}'
    topics = [r[3] for r in raw_events(database, rt.settings.namespace, session_id)]
    # Like a command tool's, its process is on record before it runs.
    assert "turnlog.session.ToolCallProcessStarted.v1" in topics


def test_arguments_that_do_not_match_the_type_hints_are_refused(python_runtime: Runtime) -> None:
    reply = ask(python_runtime, "word_count", {"path": "x", "min_length": "many"})
    assert "word_count" in reply and "min_length" in reply and "integer" in reply
    reply = ask(python_runtime, "word_count", {"path": "x", "colour": "red"})
    assert "colour" in reply


def test_a_hanging_tool_is_bounded_by_its_timeout(python_runtime: Runtime) -> None:
    started = time.monotonic()
    reply = ask(python_runtime, "hang", {"seconds": 60})
    assert "timed out after 1s" in reply
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("source", "cause"),
    [
        ("raise RuntimeError('no config here')\n", "cannot be imported: RuntimeError: no config"),
        (
            "import turnlog\n@turnlog.tool()\ndef f(x):\n    'Doc.'\n",
            "parameter 'x' has no type hint",
        ),
        ("X = 1\n", "has no @turnlog.tool function"),
        (
            "import turnlog\n@turnlog.tool()\ndef echo(text: str) -> str:\n    'Doc.'\n",
            "'echo' is declared twice",
        ),
    ],
    ids=["raises-on-import", "no-type-hints", "no-tools", "duplicate-name"],
)
def test_a_bad_tool_module_is_refused_at_start_up_naming_the_cause(
    settings: Settings, modules: Path, source: str, cause: str
) -> None:
    name = write(modules, f"bad_{abs(hash(source))}", source)
    with pytest.raises(ConfigurationError, match=cause):
        build_tools(settings.model_copy(update={"tool_modules": name}))


def test_modules_can_be_named_in_the_tools_file(settings: Settings, modules: Path) -> None:
    tools_file = modules / "tools.toml"
    tools_file.write_text('modules = ["sample_tools"]\n')
    tools = build_tools(settings.model_copy(update={"tools_file": tools_file}))
    assert {"word_count", "hang", "slow_read", "slow_write"} <= set(tools.names())


def test_a_missing_module_stops_the_command_at_start_up(settings: Settings) -> None:
    env = turnlog_env(settings, TURNLOG_TOOL_MODULES="no_such_tools_module")
    done = subprocess.run(
        [sys.executable, "-m", "turnlog", "tools", "list"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "no_such_tools_module" in done.stderr and "cannot be imported" in done.stderr


# ------------------------------------------------------ killed mid-call


def _kill_mid_call(
    settings: Settings, database: Database, modules: Path, tool: str, mark: str
) -> tuple[str, Path]:
    """Start a call of ``tool`` and SIGKILL its worker mid-call; its marker file is in the
    session's sandbox (the one place a tool process can write)."""
    env = turnlog_env(
        settings, TURNLOG_TOOL_MODULES="sample_tools", PYTHONPATH=f"{modules}{os.pathsep}{ROOT}"
    )
    created = subprocess.run(
        [sys.executable, "-m", "turnlog", "sessions", "new"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    session_id = created.stdout.strip()
    marker = settings.sandbox_root / session_id / mark
    arguments = {"seconds": 30, "marker": str(marker)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnlog", "sessions", "send", session_id,
         f"/tool {tool} {json.dumps(arguments)}"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def started() -> bool:
            topics = [r[3] for r in raw_events(database, settings.namespace, UUID(session_id))]
            if "turnlog.session.ToolCallProcessStarted.v1" not in topics:
                return False
            # slow_read marks as it begins: wait until the call really runs, since its
            # process is recorded before it has imported anything (a slow start under load).
            return tool != "slow_read" or (marker.exists() and "ran" in marker.read_text())

        eventually(started, deadline=60)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    return session_id, marker


@pytest.mark.fault
def test_a_read_only_python_tool_killed_mid_call_is_run_again(
    settings: Settings, database: Database, modules: Path, tmp_path: Path
) -> None:
    session_id, marker = _kill_mid_call(settings, database, modules, "slow_read", "read.marks")
    # The killed call is run again as it was asked (30 s): let that run answer at once.
    Path(f"{marker}.release").touch()
    env = turnlog_env(settings, TURNLOG_TOOL_MODULES="sample_tools", PYTHONPATH=str(modules))
    fast = json.dumps({"seconds": 0, "marker": str(marker.parent / "other.marks")})
    done = subprocess.run(
        [sys.executable, "-m", "turnlog", "sessions", "send", session_id,
         f"/tool slow_read {fast}"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # Recovery re-ran the killed call (a second mark) before the new turn.
    assert marker.read_text().count("ran") == 2


@pytest.mark.fault
def test_a_side_effecting_python_tool_killed_mid_call_leaves_its_outcome_unknown(
    settings: Settings, database: Database, modules: Path, tmp_path: Path
) -> None:
    session_id, _ = _kill_mid_call(settings, database, modules, "slow_write", "write.marks")
    env = turnlog_env(settings, TURNLOG_TOOL_MODULES="sample_tools", PYTHONPATH=str(modules))
    done = subprocess.run(
        [sys.executable, "-m", "turnlog", "sessions", "send", session_id, "hello"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # refused: the turn is interrupted
    assert "slow_write" in done.stderr or "unresolved" in done.stderr
    topics = [r[3] for r in raw_events(database, settings.namespace, UUID(session_id))]
    assert "turnlog.session.TurnInterrupted.v1" in topics


MY_TOOLS = '''
import turnlog


@turnlog.tool(effect="read_only")
def shout(text: str) -> str:
    """Say it louder."""
    return text.upper()
'''


def test_a_module_named_in_a_tools_file_loads_from_that_file_s_folder_as_documented(
    settings: Settings, tmp_path: Path
) -> None:
    """``my_tools.py`` beside ``tools.toml``; ``turnlog`` run from elsewhere, no PYTHONPATH."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "my_tools.py").write_text(MY_TOOLS)
    (folder / "tools.toml").write_text('modules = ["my_tools"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = turnlog_env(settings, TURNLOG_TOOLS_FILE=str(folder / "tools.toml"))
    env.pop("PYTHONPATH", None)
    script = str(Path(sys.executable).parent / "turnlog")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [script, *args], capture_output=True, text=True, env=env, cwd=elsewhere, timeout=120
        )

    listed = run("tools", "list")
    assert listed.returncode == 0, listed.stderr
    assert "shout" in listed.stdout
    session = run("sessions", "new", "--tools", "shout")
    assert session.returncode == 0, session.stderr
    sent = run("sessions", "send", session.stdout.strip(), '/tool shout {"text": "hello"}')
    assert sent.returncode == 0, sent.stderr
    assert "HELLO" in sent.stdout
