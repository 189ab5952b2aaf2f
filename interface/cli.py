"""The ``turnlog`` command.

Each invocation is its own process: two invocations in a row are already a
restart, and everything the second one knows comes from the stored events.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from turnlog import __version__
from turnlog.application.errors import ConfigurationError
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.interface import cli_work
from turnlog.interface.bootstrap import Process, build_process
from turnlog.interface.cli_db import db_app
from turnlog.interface.cli_purge import retention_app
from turnlog.interface.cli_read import audit, projections_app
from turnlog.interface.cli_sandboxes import sandboxes_app
from turnlog.interface.cli_sessions import sessions_app
from turnlog.interface.cli_tools import tools_app
from turnlog.interface.cli_turns import tool_calls_app, turns_app
from turnlog.interface.demo import demo_app
from turnlog.interface.serve import serve
from turnlog.interface.terminal import err, fail

app = typer.Typer(
    help="turnlog: an agent runtime whose sessions are event streams in PostgreSQL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(sessions_app, name="sessions")
app.add_typer(turns_app, name="turns")
app.add_typer(tool_calls_app, name="tool-calls")
app.add_typer(db_app, name="db")
app.add_typer(demo_app, name="demo")
app.add_typer(sandboxes_app, name="sandboxes")
app.add_typer(tools_app, name="tools")
app.add_typer(projections_app, name="projections")
app.add_typer(retention_app, name="retention")
app.command("audit")(audit)
app.command("serve")(serve)
app.command("worker")(cli_work.worker)
app.command("check")(cli_work.check)
app.command("workers")(cli_work.workers)


@dataclass
class Context:
    """Settings overrides from the global flags; the command's process is built on first use."""

    overrides: dict[str, Any] = field(default_factory=dict)
    _settings: Settings | None = None
    _process: Process | None = None
    owns_schema: bool = False  # a one-shot command never migrates the tables; ``db init`` does

    def settings(self) -> Settings:
        if self._settings is None:
            try:
                self._settings = Settings(**self.overrides)
            except ValidationError as exc:
                fail(2, "invalid settings: " + "; ".join(e["msg"] for e in exc.errors()))
        return self._settings

    def process(self) -> Process:
        """The one-shot command's process (runtime; read models on first use), started."""
        if self._process is None:
            try:
                process = build_process(self.settings(), None)
                process.owns_schema = self.owns_schema
                self._process = process.start()
            except ConfigurationError as exc:
                fail(2, f"invalid configuration: {exc.detail}")
        return self._process

    def runtime(self) -> Runtime:
        runtime = self.process().runtime
        assert runtime is not None
        return runtime

    def close(self) -> None:
        if self._process is not None:
            self._process.stop()


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"turnlog {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    namespace: Annotated[
        str | None, typer.Option(help="Namespace (env TURNLOG_NAMESPACE).")
    ] = None,
    database_url: Annotated[
        str | None, typer.Option(help="PostgreSQL URL (env TURNLOG_DATABASE_URL); unset: embedded.")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Local state directory (env TURNLOG_DATA_DIR).")
    ] = None,
) -> None:
    """turnlog: sessions as event streams in PostgreSQL."""
    overrides = {
        k: v
        for k, v in {
            "namespace": namespace,
            "database_url": database_url,
            "data_dir": data_dir,
        }.items()
        if v is not None
    }
    state = Context(overrides)
    ctx.obj = state
    ctx.call_on_close(state.close)


def entrypoint() -> None:
    """Console script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
