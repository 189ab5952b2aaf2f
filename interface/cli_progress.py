"""The steps of a turn as ``sessions send`` runs it, for a person at a terminal.

An ``Observer`` of the executor: it prints each model call and tool call to
stderr as it ends (a tool also as it starts), so a long turn is not silent.
Observers run on the turn's thread and must never raise; printing is all
this one does.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from turnlog.application.observer import Unobserved


class StepPrinter(Unobserved):
    """Prints model and tool steps to ``console``; ignores everything else."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def model_called(self, provider: str, outcome: str, seconds: float) -> None:
        self.console.print(f"[dim]model call {escape(outcome)} in {seconds:.2f}s[/]")

    def tool_started(self, tool: str) -> None:
        self.console.print(f"[dim]tool {escape(tool)} started[/]")

    def tool_called(self, tool: str, outcome: str, seconds: float) -> None:
        self.console.print(f"[dim]tool {escape(tool)} {escape(outcome)} in {seconds:.2f}s[/]")
