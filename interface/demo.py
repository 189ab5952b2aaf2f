"""``turnlog demo``: the seed experiment, each step a separate process."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

demo_app = typer.Typer(help="Runnable demonstrations.", no_args_is_help=True)
out = Console(highlight=False, soft_wrap=True)

WORDS = [
    "amber",
    "basalt",
    "cobalt",
    "dahlia",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kestrel",
    "lantern",
    "marble",
    "nectar",
    "obsidian",
    "pelican",
    "quartz",
    "raven",
    "saffron",
    "tundra",
    "umber",
    "velvet",
    "willow",
    "zephyr",
]


def _turnlog(*args: str) -> str:
    """Run ``turnlog ARGS`` as a new process; return its output or fail loudly."""
    command = [sys.executable, "-m", "turnlog", *args]
    done = subprocess.run(
        command, capture_output=True, text=True, env=os.environ.copy(), timeout=300
    )
    if done.returncode != 0:
        out.print(f"[bold red]FAILED[/] turnlog {' '.join(args)} (exit {done.returncode})")
        out.print(done.stdout + done.stderr)
        raise typer.Exit(1)
    return done.stdout.strip()


@demo_app.command("codeword")
def codeword(
    word: Annotated[str, typer.Option(help="The codeword (default: a random word).")] = "",
) -> None:
    """Store a codeword and recall it, each step in its own process."""
    word = word or random.choice(WORDS)
    out.print("[bold]1.[/] turnlog sessions new (process 1)")
    session_id = _turnlog("sessions", "new", "--title", "codeword demo")
    out.print(f"   session {session_id}")
    out.print(f"[bold]2.[/] send 'The codeword is {word}' (process 2)")
    out.print(f"   reply: {_turnlog('sessions', 'send', session_id, f'The codeword is {word}')}")
    out.print("[bold]3.[/] send 'What is the codeword?' (process 3, rebuilt from stored events)")
    reply = _turnlog("sessions", "send", session_id, "What is the codeword?")
    out.print(f"   reply: {reply}")
    if word.lower() not in reply.lower():
        out.print(f"[bold red]FAILED:[/] the reply does not name the codeword {word!r}")
        raise typer.Exit(1)
    out.print(f"[bold green]OK:[/] a fresh process recalled the codeword {word!r}")


@demo_app.command("restart")
def restart(
    ctx: typer.Context,
    receipt: Annotated[
        Path | None, typer.Option(help="Write the JSON receipt of every step here.")
    ] = None,
    word: Annotated[str, typer.Option(help="The codeword (default: a random word).")] = "",
) -> None:
    """Codeword recall across a SIGKILL, then a kill mid-tool-call with probes off and on."""
    from turnlog.interface.demo_support import DemoFailed
    from turnlog.interface.restart_demo import RestartDemo

    settings = ctx.find_root().obj.settings()
    demo = RestartDemo(settings, lambda line: out.print(line, markup=False), word)
    out.print(f"turnlog restart demo — namespace {settings.namespace}, port {demo.port}")
    code = 0
    try:
        demo.run()
        out.print("[bold green]OK:[/] every step held")
    except DemoFailed as exc:
        out.print(f"[bold red]FAILED:[/] {exc} (server log: {demo.log_path})")
        code = 1
    finally:
        if receipt is not None:
            receipt.parent.mkdir(parents=True, exist_ok=True)
            receipt.write_text(demo.receipt.as_json())
            out.print(f"receipt: {receipt}")
    raise typer.Exit(code)
