"""What every `turnlog` command shares: output consoles, refusals, running on the runtime, waiting
for a stop signal."""

from __future__ import annotations

import getpass
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeVar
from uuid import UUID

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from turnlog.interface.problems import exit_code_for, problem_for

if TYPE_CHECKING:
    from turnlog.application.runtime import Runtime
    from turnlog.application.settings import Settings

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

    owns_schema: bool

    def settings(self) -> Settings: ...

    def runtime(self) -> Runtime: ...


def ctx_of(ctx: typer.Context) -> _Root:
    obj: _Root = ctx.find_root().obj
    return obj


def parse_uuid(value: str, what: str = "session id") -> UUID:
    try:
        return UUID(value)
    except ValueError:
        fail(4, f"{what} {value!r} is not a valid id; no such session")


def default_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


def run(ctx: typer.Context, action: Callable[[Runtime], T]) -> T:
    """``action`` on the command's runtime; a refusal becomes a message and its exit code."""
    root: _Root = ctx.find_root().obj
    with refusals():
        return action(root.runtime())


class SignalStop:
    """Set by SIGTERM or SIGINT, for a long-running command's main thread to wait on.

    The handler only flips a flag. It must take no lock: it runs in the main
    thread between two bytecodes, possibly while that thread holds the very lock
    (a ``threading.Event``'s, say) the handler would need, which hangs the process
    for good. And a blocking wait is not woken by a signal the kernel hands to
    another thread, so ``wait`` looks at the flag at least every ``TICK`` seconds.
    """

    TICK = 0.2

    def __init__(self) -> None:
        self.signum: int | None = None

    def is_set(self) -> bool:
        return self.signum is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Until a stop signal came (True) or ``timeout`` seconds passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.signum is None:
            left = self.TICK if deadline is None else min(self.TICK, deadline - time.monotonic())
            if left <= 0:
                return False
            time.sleep(left)
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum


def stop_on_signals() -> SignalStop:
    """A stop that SIGTERM or SIGINT sets, for long-running commands to wait on."""
    stop = SignalStop()
    signal.signal(signal.SIGTERM, stop._on_signal)
    signal.signal(signal.SIGINT, stop._on_signal)
    return stop


def signal_name(number: int) -> str:
    """SIGTERM for 15; "signal N" for a number with no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
