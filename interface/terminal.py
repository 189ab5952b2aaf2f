"""What every `turnlog` command shares: output consoles, refusals, waiting for a stop signal."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from turnlog.interface.problems import exit_code_for, problem_for

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


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


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, for long-running commands to wait on."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
