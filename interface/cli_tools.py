"""``turnlog tools``: the tools this process offers (built-ins, shell, the tools file)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from turnlog.application.tools.port import ToolSpec
from turnlog.interface.terminal import out, run

tools_app = typer.Typer(help="The tools sessions can call.", no_args_is_help=True)


@tools_app.command("list")
def tools_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Name, effect class, description and parameters of every tool (a bad tools file fails)."""
    specs: list[ToolSpec] = run(ctx, lambda rt: rt.executor.tools.specs())
    if as_json:
        rows = [
            {
                "name": s.name,
                "effect": str(s.effect),
                "description": s.description,
                "parameters": s.parameters,
            }
            for s in specs
        ]
        typer.echo(json.dumps(rows))
        return
    table = Table("tool", "effect", "description", "arguments (* required)")
    for s in specs:
        table.add_row(s.name, str(s.effect), s.description, _arguments(s))
    out.print(table)


def _arguments(spec: ToolSpec) -> str:
    required = set(spec.parameters.get("required", []))
    properties = spec.parameters.get("properties", {})
    return ", ".join(
        f"{name}{'*' if name in required else ''}: {schema.get('type', 'any')}"
        for name, schema in properties.items()
    )
