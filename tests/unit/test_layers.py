"""Imports point inwards: interface → application / projections → domain; no import cycles.

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
LAYERS = ("domain", "application", "projections", "interface")

PROJECTIONS_MAY_USE = {
    "application.store.chain",  # the log's hash chain, which audit recomputes
    "application.store.seal",  # the snapshots' seal, which audit checks
    "application.store.database",
    "application.errors",
    # the process's one reader of the log's tail, whose pages they fold
    "application.store.follower",
    "application.store.logorder",  # the log's order and commit horizon (how the log is read)
    "application.store.epoch",  # the server's epoch: a page read before a restart is not folded
    "application.settings",
    "application.sessions",
}


def _is_package(module: str) -> bool:
    return (ROOT / module.removeprefix("turnlog.").replace(".", "/") / "__init__.py").exists()


def imports_of(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from turnlog.application.store import x` names only x: a package's
                # own module (its __init__) is empty
                if not _is_package(node.module):
                    names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        found[str(path.relative_to(ROOT))] = names
    return found


def module_graph() -> dict[str, set[str]]:
    """Each module of the four layers → the modules of theirs it imports.

    Every import counts: at the top, inside a function, for types only; but
    not that of a package the module is in (Python has imported it already).
    """
    imports: dict[str, set[str]] = {}
    for package in LAYERS:
        for path, names in imports_of(package).items():
            module = "turnlog." + path.removesuffix(".py").replace("/", ".")
            imports[module.removesuffix(".__init__")] = names

    def module_of(name: str) -> str | None:
        while name and name not in imports:
            name = name.rpartition(".")[0]
        return name or None

    return {
        module: {
            m
            for m in map(module_of, names)
            if m is not None and m != module and not module.startswith(m + ".")
        }
        for module, names in imports.items()
    }


def a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle, as the modules around it (first one again at the end); [] if none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str]:
        path.append(module)
        for imported in sorted(graph[module]):
            if imported in path:
                return [*path[path.index(imported) :], imported]
            if imported not in done and (found := visit(imported)):
                return found
        path.pop()
        done.add(module)
        return []

    for module in sorted(graph):
        if module not in done and (found := visit(module)):
            return found
    return []


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


def test_a_cycle_is_found_when_there_is_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"b", "d"}, "d": set()}
    assert a_cycle(graph) == ["b", "c", "b"]
    assert a_cycle({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back() -> None:
    """A cycle makes import order matter (a lazy import inside a function only hides it)."""
    graph = module_graph()
    assert {"turnlog.interface.cli", "turnlog.domain.session"} <= set(graph)
    assert "turnlog.domain.session" in graph["turnlog.domain.progress"]
    cycle = a_cycle(graph)
    assert not cycle, "import cycle: " + " → ".join(cycle)


def test_the_http_api_and_the_console_list_workers_without_importing_the_worker() -> None:
    """They read the workers registry (store.workers_registry), not the worker's code."""
    for package in ("interface/http", "interface/console"):
        for path, names in imports_of(package).items():
            bad = {n for n in names if ours(n, "application.execution.worker")}
            assert not bad, f"{path} imports the worker: {sorted(bad)}"
