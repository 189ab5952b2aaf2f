"""One builder: every process's parts are made by ``interface.bootstrap`` and nowhere else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from turnlog.application.settings import Settings
from turnlog.interface.bootstrap import Process
from turnlog.interface.http import create_app
from turnlog.interface.roles import Role

SOURCE = Path(__file__).resolve().parents[2]
BUILDER = "interface/bootstrap.py"

# The parts of a process: constructing one of these is building a process.
PARTS = (
    "Sessions",
    "Executor",
    "Runtime",
    "Leases",
    "LogFollower",
    "ReadModels",
    "ProjectionSupervisor",
    "Worker",
    "build_runtime",
    "open_sessions",
)


def _constructions() -> list[str]:
    made = re.compile(r"(?<![\w.])(" + "|".join(PARTS) + r")\(")
    found = []
    for folder in ("domain", "application", "projections", "interface"):
        for path in sorted((SOURCE / folder).rglob("*.py")):
            where = str(path.relative_to(SOURCE))
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if made.search(code) and not re.match(r"\s*(def|class) ", code):
                    found.append(f"{where}:{number}: {line.strip()}")
    return found


def test_the_parts_of_a_process_are_made_only_by_the_builder() -> None:
    elsewhere = [f for f in _constructions() if not f.startswith(BUILDER)]
    # The runtime makes its own lease pool from its database: a field, not a process part.
    elsewhere = [f for f in elsewhere if "self.leases = Leases(" not in f]
    assert elsewhere == []
    assert any("build_runtime(self.settings" in f for f in _constructions())


@pytest.mark.parametrize("role", list(Role))
def test_every_serve_role_gets_its_process_from_the_builder(role: Role) -> None:
    app = create_app(Settings(), role=role)  # not started: no database needed
    process = app.state.turnlog.process
    assert isinstance(process, Process)
    assert process.role is role and process.runtime is None


def test_the_commands_that_run_processes_ask_the_builder() -> None:
    for path in ("interface/cli.py", "interface/cli_read.py", "interface/cli_work.py"):
        text = (SOURCE / path).read_text()
        assert "build_process(" in text, path
