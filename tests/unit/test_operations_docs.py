"""The README and the operations guide name only real commands, endpoints and files."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.unit.test_docker import resolve
from turnlog.application.settings import Settings
from turnlog.interface.http import create_app
from turnlog.interface.roles import Role

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "operations.md"]


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def documented_commands() -> list[tuple[str, list[str]]]:
    """Every `turnlog …` command line in a shell block or an inline code span of the docs."""
    found = []
    for path in DOCS:
        text = path.read_text()
        lines = [line for block in shell_blocks(text) for line in block.splitlines()]
        lines += re.findall(r"`(turnlog [^`]+)`", text)
        for line in lines:
            start = line.find("turnlog ")
            if "docker compose" in line:  # `… run --rm --no-deps init <turnlog arguments>`
                start = line.find(" init ") + len(" init ") if " init " in line else -1
                line = "turnlog " + line[start:] if start >= 0 else ""
                start = 0 if line else -1
            if start < 0 or "…" in line or "[" in line:  # placeholders, optional parts
                continue
            command = re.sub(r"\s&\s*(#.*)?$", "", line[start:])  # run in the background
            args = shlex.split(command, comments=True)[1:]
            if args and not args[0].startswith("-") and args[0] not in ("serve,",):
                found.append((path.name, args))
    return found


@pytest.mark.parametrize(
    ("doc", "args"), documented_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_every_documented_command_is_real(doc: str, args: list[str]) -> None:
    resolve(args)


def test_the_walkthrough_commands_are_among_those_checked() -> None:
    found = [args for _, args in documented_commands()]
    for expected in (["serve"], ["audit", "$SID"], ["db", "stop"], ["projections", "rebuild"]):
        assert expected in found, expected


def test_every_endpoint_in_the_readme_table_is_served() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## The HTTP API", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Z]+) ([^`]+)`", section, re.M)
    assert len(rows) >= 10
    paths = create_app(Settings(), role=Role.ALL).openapi()["paths"]
    for method, path in rows:
        normalized = re.sub(r"\{id\}", "{session_id}", path.split("?", 1)[0])
        assert normalized in paths, path
        assert method.lower() in paths[normalized], f"{method} {path}"


def test_every_relative_link_points_at_a_file_and_heading_that_exist() -> None:
    for path in DOCS:
        for target in re.findall(r"\]\((?!https?:)([^)\s]+)\)", path.read_text()):
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if "screenshots" in file:
                continue  # pictures the browser tests take
            assert linked.exists(), f"{path.name}: {target}"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
                slugs = {
                    re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings
                }
                assert anchor in slugs, f"{path.name}: {target}"
