"""Imports point inwards: interface → application / projections → domain.

Projections read the log through the application's infrastructure (database
connection, settings, errors, the log's order and its one follower per
process, and the Sessions application's mapper, which decodes stored events
exactly as the aggregate sees them) but never its use cases: commands, the
agent loop, workers, recovery, providers or tools.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROJECTIONS_MAY_USE = {
    "application.chain",  # the log's hash chain, which audit recomputes
    "application.database",
    "application.errors",
    "application.follower",  # the process's one reader of the log's tail, whose pages they fold
    "application.logorder",  # the log's order and commit horizon (how the log is read)
    "application.settings",
    "application.sessions",
}


def imports_of(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from turnlog.application import x` names only x
                if "." in node.module.removeprefix("turnlog."):
                    names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        found[str(path.relative_to(ROOT))] = names
    return found


def ours(name: str, package: str) -> bool:
    qualified = f"turnlog.{package}"
    return name == qualified or name.startswith(qualified + ".")


def test_no_module_imports_a_layer_by_its_bare_folder_name() -> None:
    """Everything is imported as ``turnlog.<layer>``: a bare ``domain`` would load twice."""
    for package in ("domain", "application", "projections", "interface"):
        for path, names in imports_of(package).items():
            bare = {
                n
                for n in names
                for p in ("domain", "application", "projections", "interface")
                if n == p or n.startswith(p + ".")
            }
            assert not bare, f"{path} imports a bare layer name: {sorted(bare)}"


def test_the_application_never_imports_projections_or_the_interface() -> None:
    for path, names in imports_of("application").items():
        bad = {n for n in names if ours(n, "projections") or ours(n, "interface")}
        assert not bad, f"{path} imports outward: {sorted(bad)}"


def test_projections_never_import_the_interface_or_the_application_use_cases() -> None:
    for path, names in imports_of("projections").items():
        bad = {
            n
            for n in names
            if ours(n, "interface")
            or (ours(n, "application") and not any(ours(n, m) for m in PROJECTIONS_MAY_USE))
        }
        assert not bad, f"{path} imports outward: {sorted(bad)}"


def test_the_domain_imports_nothing_of_the_outer_layers() -> None:
    for path, names in imports_of("domain").items():
        bad = {
            n for n in names if any(ours(n, p) for p in ("application", "projections", "interface"))
        }
        assert not bad, f"{path} imports outward: {sorted(bad)}"
