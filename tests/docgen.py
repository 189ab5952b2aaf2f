"""The pictures in the docs, generated from the code so that they cannot drift.

Each picture is a Mermaid block between ``<!-- generated:NAME:begin -->`` and
``<!-- generated:NAME:end -->`` markers in README.md or a page of docs/.
``python -m tests.docgen`` (``make docs``) rewrites every block;
``tests/unit/test_pictures.py`` fails while a committed block differs from
what this module generates.

- ``turn-states`` and ``call-states``: the state machines of a turn and of a
  tool call, traced by driving the real Session aggregate through every
  command in a set of scripted histories and watching each stored event's
  effect (so an edge is an event the domain really records in that state).
- ``process-shape``: what each ``serve --role`` runs (``interface.roles``) and
  the read models it keeps (``projections.catalog``).
- ``subsystems``: the layers and the application's subpackages, with an
  edge wherever a module of one imports a module of the other (read from
  the source, lazy imports included).
"""

from __future__ import annotations

import ast
import copy
import re
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("domain", "application", "projections", "interface")
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

# --------------------------------------------------------------- state machines

Edge = tuple[str, str, str]  # (from, to, event)
START = "[*]"


def _histories() -> Iterator[Callable[[Any], None]]:
    """Scripted histories: each drives one session through real commands.

    Between them they take a turn through every transition the aggregate
    has; ``tests/unit/test_pictures.py`` checks that every state and every
    event that moves a turn or a call appears, so a new transition that no
    history reaches fails there.
    """
    from turnlog.domain.turns import Effect, ProbeAnswer

    def running(s: Any, **submit: Any) -> tuple[str, int]:
        turn, _ = s.submit_turn("hello", **submit)
        return turn.turn_id, s.claim_turn(turn.turn_id, "w1")

    def with_call(s: Any, effect: Effect = Effect.SIDE_EFFECTING, *more: str) -> tuple[str, int]:
        turn_id, claim = running(s)
        calls = [{"call_id": c, "name": "t", "arguments": {}} for c in ("c1", *more)]
        s.record_model_reply(turn_id, claim, "", calls)
        s.start_tool_call(turn_id, claim, "c1", "w1", effect)
        return turn_id, claim

    def completed(s: Any) -> None:
        turn_id, claim = running(s)
        s.record_model_reply(turn_id, claim, "hi", [])
        s.complete_turn(turn_id, claim, "hi")

    def failed(s: Any) -> None:
        turn_id, claim = running(s)
        s.fail_turn(turn_id, claim, "provider error")

    def tool_succeeded(s: Any) -> None:
        turn_id, claim = with_call(s)
        s.record_tool_succeeded(turn_id, claim, "c1", 1, {"ok": True})
        s.complete_turn(turn_id, claim, "done")

    def tool_failed_then_turn_failed(s: Any) -> None:
        turn_id, claim = with_call(s)
        s.record_tool_failed(turn_id, claim, "c1", 1, "boom")
        s.fail_turn(turn_id, claim, "gave up")

    def started_call_failed_with_turn(s: Any) -> None:
        turn_id, claim = with_call(s, Effect.READ_ONLY)
        s.fail_turn(turn_id, claim, "worker crashed")

    def pending_call_failed_with_turn(s: Any) -> None:
        turn_id, claim = running(s)
        s.record_model_reply(turn_id, claim, "", [{"call_id": "c1", "name": "t", "arguments": {}}])
        s.fail_turn(turn_id, claim, "provider error")

    def interrupted_resolved(s: Any) -> None:
        turn_id, _ = with_call(s)
        s.interrupt_turn(turn_id, previous_worker="w1")
        s.resolve_tool_call("c1", "succeeded", {"ok": True}, "checked", "ops")

    def interrupted_abandoned(s: Any) -> None:
        turn_id, _ = with_call(s, Effect.SIDE_EFFECTING, "c2")  # c2 never started
        s.interrupt_turn(turn_id, previous_worker="w1")
        s.abandon_turn(turn_id, "cannot tell", "ops")

    def settled_by_probe(s: Any) -> None:
        turn_id, _ = with_call(s)
        claim = s.claim_turn(turn_id, "w2")
        s.record_probe(turn_id, claim, "c1", ProbeAnswer.APPLIED, {}, "", 0.0, "w2")
        s.resolve_by_probe(turn_id, claim, "c1", {"ok": True})

    def rerun_after_crash(s: Any) -> None:
        turn_id, _ = with_call(s, Effect.READ_ONLY)
        claim = s.claim_turn(turn_id, "w2")
        s.start_tool_call(turn_id, claim, "c1", "w2", Effect.READ_ONLY)

    def cancelled_queued(s: Any) -> None:
        turn, _ = s.submit_turn("hello")
        s.cancel_turn(turn.turn_id, "not needed", "ops")

    def cancelled_running(s: Any) -> None:
        turn_id, claim = with_call(s, Effect.READ_ONLY)
        s.cancel_turn(turn_id, "not needed", "ops")
        s.finish_cancel(turn_id, datetime.now(UTC), claim)

    def deadline_passed(s: Any) -> None:
        at = datetime.now(UTC) + timedelta(seconds=1)
        turn, _ = s.submit_turn("hello", deadline_at=at)
        s.finish_cancel(turn.turn_id, at + timedelta(seconds=1))

    def proposed(s: Any) -> tuple[str, int]:
        turn_id, claim = running(s)
        s.record_model_reply(turn_id, claim, "", [{"call_id": "c1", "name": "t", "arguments": {}}])
        s.propose_tool_call(turn_id, claim, "c1")
        return turn_id, claim

    def approved(s: Any) -> None:
        proposed(s)
        s.approve_tool_call("c1", "ops")

    def rejected(s: Any) -> None:
        proposed(s)
        s.reject_tool_call("c1", "ops", "no")

    def cancelled_awaiting(s: Any) -> None:
        turn_id, _ = proposed(s)
        s.cancel_turn(turn_id, "not needed", "ops")

    yield from (
        completed,
        failed,
        tool_succeeded,
        tool_failed_then_turn_failed,
        started_call_failed_with_turn,
        pending_call_failed_with_turn,
        interrupted_resolved,
        interrupted_abandoned,
        settled_by_probe,
        rerun_after_crash,
        cancelled_queued,
        cancelled_running,
        deadline_passed,
        approved,
        rejected,
        cancelled_awaiting,
    )


class _Tracer:
    """Applies each recorded event to a shadow copy and notes what it moved."""

    def __init__(self) -> None:
        self.turn_edges: set[Edge] = set()
        self.call_edges: set[Edge] = set()

    def trace(self, history: Callable[[Any], None]) -> None:
        from turnlog.domain.session import Session, retaining

        session = retaining(Session.start(title="picture", system_prompt=""))
        session.collect_events()
        shadow = copy.deepcopy(session)
        commands = _Recording(session, lambda: self._follow(session, shadow))
        history(commands)

    def _follow(self, session: Any, shadow: Any) -> None:
        for event in session.collect_events():
            name = type(event).__name__
            turn_id, call_id = getattr(event, "turn_id", ""), getattr(event, "call_id", "")
            turn = _state(shadow.turn_state, turn_id)
            calls = _call_states(shadow)
            event.mutate(shadow)
            turn_now = _state(shadow.turn_state, turn_id)
            if turn_id and turn != turn_now:
                self.turn_edges.add((turn, turn_now, name))
            for key, now in _call_states(shadow).items():
                before = calls.get(key, START)
                if before != now or (name == "ToolCallStarted" and key == call_id):
                    self.call_edges.add((before, now, name))


class _Recording:
    """The session's commands, each followed by tracing what it recorded."""

    def __init__(self, session: Any, after: Callable[[], None]) -> None:
        self._session, self._after = session, after

    def __getattr__(self, name: str) -> Any:
        command = getattr(self._session, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            result = command(*args, **kwargs)
            self._after()
            return result

        return run


def _state(look: Callable[[str], Any], key: str) -> str:
    """A turn's or a call's state by its id ("[*]" before it exists)."""
    from turnlog.domain.errors import DomainError

    if not key:
        return START
    try:
        found = look(key)
    except DomainError:
        return START
    return str(getattr(found, "state", found))


def _call_states(session: Any) -> dict[str, str]:
    return {call_id: str(call.state) for call_id, call in session.calls.items()}


def traced() -> _Tracer:
    tracer = _Tracer()
    for history in _histories():
        tracer.trace(history)
    return tracer


def state_diagram(edges: set[Edge]) -> str:
    """A Mermaid state diagram, one line per (from, to) with its events."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for before, after, event in sorted(edges):
        grouped.setdefault((before, after), []).append(event)
    lines = ["stateDiagram-v2"]
    for (before, after), events in sorted(grouped.items(), key=_edge_order):
        lines.append(f"    {before} --> {after}: {', '.join(sorted(set(events)))}")
    return "```mermaid\n" + "\n".join(lines) + "\n```"


def _edge_order(item: tuple[tuple[str, str], list[str]]) -> tuple[int, str, str]:
    (before, after), _ = item
    return (0 if before == START else 1, before, after)


def state_moving_events() -> dict[str, set[str]]:
    """Events whose ``apply`` sets a turn's or a call's state, read from the domain's source.

    ``{"turn": {...}, "call": {...}}``: every one of them must be an edge of
    the traced diagrams, whichever module of domain/ defines it.
    """
    found: dict[str, set[str]] = {"turn": set(), "call": set()}
    for path in sorted((ROOT / "domain").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            apply = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "apply"]
            for inner in (n for f in apply for n in ast.walk(f)):
                text = ast.unparse(inner) if isinstance(inner, ast.Call | ast.Assign) else ""
                if isinstance(inner, ast.Call) and text.startswith("_move("):
                    found["turn"].add(node.name)
                if isinstance(inner, ast.Assign) and re.match(r".*\.state = CallState\.", text):
                    found["call"].add(node.name)
    return found


# ----------------------------------------------------------------- process shape


def process_shape() -> str:
    from turnlog.interface.roles import Role
    from turnlog.projections.catalog import READ_MODELS

    models = ", ".join(READ_MODELS)
    lines = ["flowchart LR", '    client(["HTTP clients, console, CLI"])']
    lines.append(f'    pg[("PostgreSQL<br/>schema turnlog_namespace:<br/>log, {models}")]')
    for role in Role:
        parts = []
        if role.serves_api:
            parts.append(("api", "HTTP API"))
        if role.runs_worker:
            parts.append(("worker", "worker"))
        if role.runs_projections:
            parts.append(("projections", "projection runners"))
        lines.append(f'    subgraph {role.value}_role["serve --role {role.value}"]')
        lines += [f'        {role.value}_{key}["{label}"]' for key, label in parts]
        lines.append("    end")
        for key, _ in parts:
            node = f"{role.value}_{key}"
            if key == "api":
                lines.append(f"    client --> {node}")
            arrow = "-->" if key != "projections" else "<-->"
            lines.append(f"    {node} {arrow} pg")
    return "```mermaid\n" + "\n".join(lines) + "\n```"


# -------------------------------------------------------------------- subsystems


def subsystem(module: str) -> str | None:
    """The box a ``turnlog.…`` module belongs to in the architecture picture."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "turnlog" or parts[1] not in LAYERS:
        return None
    layer = parts[1]
    if len(parts) > 2 and _is_package(layer, parts[2]):
        return f"{layer}.{parts[2]}"
    return layer


def _is_package(layer: str, name: str) -> bool:
    return (ROOT / layer / name / "__init__.py").exists()


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["turnlog", *parts])


def import_edges() -> set[tuple[str, str]]:
    """(importer, imported) between subsystems, from every import in the four layers."""
    edges: set[tuple[str, str]] = set()
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            source = subsystem(_module_name(path))
            for node in ast.walk(ast.parse(path.read_text())):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                for name in names:
                    target = subsystem(name)
                    if source and target and target != source:
                        edges.add((source, target))
    return edges


def _boxes() -> dict[str, list[str]]:
    boxes: dict[str, list[str]] = {}
    for layer in LAYERS:
        inner = sorted(p.parent.name for p in (ROOT / layer).glob("*/__init__.py"))
        boxes[layer] = [layer, *(f"{layer}.{name}" for name in inner)]
    return boxes


def subsystems_diagram() -> str:
    edges = import_edges()
    lines = ["flowchart TB"]
    for layer, members in _boxes().items():
        lines.append(f'    subgraph {layer}_layer["{layer}/"]')
        for member in members:
            label = "top level" if member == layer else member.split(".", 1)[1] + "/"
            lines.append(f'        {_node(member)}["{label}"]')
        lines.append("    end")
    for source, target in sorted(edges):
        lines.append(f"    {_node(source)} --> {_node(target)}")
    return "```mermaid\n" + "\n".join(lines) + "\n```"


def _node(name: str) -> str:
    return name.replace(".", "_")


# ------------------------------------------------------------------------ blocks


def blocks() -> dict[str, str]:
    tracer = traced()
    return {
        "turn-states": state_diagram(tracer.turn_edges),
        "call-states": state_diagram(tracer.call_edges),
        "process-shape": process_shape(),
        "subsystems": subsystems_diagram(),
    }


def markers(name: str) -> tuple[str, str]:
    return f"<!-- generated:{name}:begin -->\n", f"\n<!-- generated:{name}:end -->"


def committed(text: str) -> dict[str, str]:
    """The generated blocks a document holds, by name."""
    pattern = r"<!-- generated:([\w-]+):begin -->\n(.*?)\n?<!-- generated:\1:end -->"
    return {m.group(1): m.group(2) for m in re.finditer(pattern, text, re.S)}


def refreshed(text: str, generated: dict[str, str]) -> str:
    for name, block in generated.items():
        begin, end = markers(name)
        pattern = re.escape(begin) + r".*?\n?" + re.escape(end.lstrip("\n"))
        replacement = f"{begin}{block}{end}"
        text = re.sub(pattern, lambda _m, r=replacement: r, text, flags=re.S)
    return text


def main() -> int:
    generated = blocks()
    for path in DOCS:
        text = path.read_text()
        new = refreshed(text, generated)
        if new != text:
            path.write_text(new)
            print(f"rewrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
