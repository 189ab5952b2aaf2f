"""What every `turnlog` command shares: output consoles, refusals, running on the runtime, waiting
for a stop signal."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from turnlog.interface.problems import exit_code_for, problem_for

if TYPE_CHECKING:
    from turnlog.application.runtime import Runtime

T = TypeVar("T")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def id_table(*headers: str, ids: int = 1) -> Table:
    """A table whose first ``ids`` columns hold ids: never wrapped, never cut to "…"."""
    table = Table(*headers)
    for column in table.columns[:ids]:
        column.no_wrap = True
    for column in table.columns[ids:]:
        column.overflow = "fold"
    return table


def print_table(table: Table) -> None:
    """Print ``table`` no narrower than its ids need, even at 80 columns or into a pipe.

    Rich fits a table to the terminal (80 columns when piped) by cutting cells
    to "…"; an id cut so cannot be copied into the next command. Wider than
    the terminal, a line wraps there, but each id stays whole in the text.
    """
    needed = Measurement.get(out, out.options.update(width=10_000), table).minimum
    if needed <= out.width:
        out.print(table)
        return
    # A console's print never goes wider than the console: use a wider one.
    Console(file=out.file, width=needed, highlight=False, soft_wrap=True).print(table)


def fail(code: int, message: str) -> NoReturn:
    """Print the error and exit with ``code``."""
    err.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


@contextmanager
def refusals() -> Iterator[None]:
    """Turn known errors into a message and the exit code of their problem."""
    try:
        yield
    except typer.Exit:
        raise
    except Exception as exc:
        problem = problem_for(exc)
        if problem is None:
            raise
        fail(exit_code_for(problem.status), f"{problem.detail} [{problem.code}]")


class _Root(Protocol):
    """What the root command's object (``interface.cli.Context``) offers every command."""

    def runtime(self) -> Runtime: ...


def run(ctx: typer.Context, action: Callable[[Runtime], T]) -> T:
    """``action`` on the command's runtime; a refusal becomes a message and its exit code."""
    root: _Root = ctx.find_root().obj
    with refusals():
        return action(root.runtime())


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, for long-running commands to wait on."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
