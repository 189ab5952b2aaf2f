"""The domain stays pure: it imports the stdlib (minus I/O), eventsourcing's domain, pydantic."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

DOMAIN = Path(__file__).resolve().parents[2] / "domain"

ALLOWED_PACKAGES = ("turnlog.domain", "eventsourcing.domain", "eventsourcing.utils", "pydantic")

# Standard-library modules that reach the file system, processes, the network or
# the clock of the machine: a pure model has no business with them.
FORBIDDEN_STDLIB = frozenset(
    {
        "asyncio",
        "ftplib",
        "glob",
        "http",
        "importlib",
        "io",
        "mmap",
        "multiprocessing",
        "os",
        "pathlib",
        "pty",
        "select",
        "selectors",
        "shutil",
        "signal",
        "smtplib",
        "socket",
        "socketserver",
        "sqlite3",
        "ssl",
        "subprocess",
        "tempfile",
        "threading",
        "urllib",
        "webbrowser",
        "xmlrpc",
    }
)


def imported_modules(source: str) -> list[str]:
    """Every absolute module a source file imports, ``from a import b`` counted as ``a.b``."""
    modules: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def is_allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top in sys.stdlib_module_names:
        return top not in FORBIDDEN_STDLIB
    return any(module == p or module.startswith(p + ".") for p in ALLOWED_PACKAGES)


def forbidden_imports(source: str) -> list[str]:
    return [m for m in imported_modules(source) if not is_allowed(m)]


def test_the_domain_imports_only_the_stdlib_eventsourcing_domain_and_itself() -> None:
    files = sorted(DOMAIN.glob("**/*.py"))
    assert len(files) >= 5

    found = {
        str(f.relative_to(DOMAIN)): bad
        for f in files
        if (bad := forbidden_imports(f.read_text(encoding="utf-8")))
    }

    assert found == {}


@pytest.mark.parametrize(
    "source",
    [
        "import os",
        "import os.path",
        "from os import environ",
        "import subprocess",
        "import socket",
        "from pathlib import Path",
        "import psycopg",
        "from psycopg import sql",
        "from eventsourcing.persistence import IntegrityError",
        "from eventsourcing import persistence",
        "from eventsourcing.application import Application",
        "from turnlog.application.tools.port import Effect",
        "from domain.turns import Turn",
        "import turnlog.interface",
        "import interface",
        "def f():\n    import httpx",
        "if True:\n    from projections import views",
    ],
)
def test_the_check_catches_a_forbidden_import(source: str) -> None:
    assert forbidden_imports(source) != []


@pytest.mark.parametrize(
    "source",
    [
        "from __future__ import annotations",
        "import json",
        "from datetime import datetime",
        "from uuid import UUID, uuid4",
        "from eventsourcing.domain import Aggregate",
        "from eventsourcing import domain",
        "from eventsourcing.utils import register_topic",
        "from pydantic import BaseModel",
        "from turnlog.domain.turns import Turn",
        "from . import errors",
    ],
)
def test_the_check_lets_an_allowed_import_through(source: str) -> None:
    assert forbidden_imports(source) == []
