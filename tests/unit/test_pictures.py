"""The docs' pictures are generated from the code (tests/docgen.py) and must not drift."""

from __future__ import annotations

import re

import pytest

from tests import docgen
from turnlog.domain.turns import CallState, TurnState


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return docgen.blocks()


def test_every_committed_picture_is_the_one_the_code_generates(generated: dict[str, str]) -> None:
    shown: set[str] = set()
    for path in docgen.DOCS:
        for name, block in docgen.committed(path.read_text()).items():
            assert name in generated, f"{path.name}: no generator for picture {name!r}"
            assert block == generated[name], (
                f"{path.name}: picture {name!r} is stale; regenerate it with `make docs`"
            )
            shown.add(name)
    assert shown == set(generated), f"pictures no doc shows: {set(generated) - shown}"


def nodes(diagram: str) -> set[str]:
    return {n for n in re.findall(r"^\s+(\S+) --> (\S+):", diagram, re.M) for n in n} - {"[*]"}


def labels(diagram: str) -> set[str]:
    return {e.strip() for line in re.findall(r": (.+)$", diagram, re.M) for e in line.split(",")}


def test_the_state_machines_show_every_state(generated: dict[str, str]) -> None:
    assert nodes(generated["turn-states"]) == {str(s) for s in TurnState}
    assert nodes(generated["call-states"]) == {str(s) for s in CallState}


def test_every_event_that_moves_a_turn_or_a_call_is_an_edge(generated: dict[str, str]) -> None:
    moving = docgen.state_moving_events()
    assert moving["turn"] and moving["call"], "no event of domain/ sets a state any more?"
    assert moving["turn"] <= labels(generated["turn-states"])
    assert moving["call"] <= labels(generated["call-states"])


def test_the_architecture_shows_every_subpackage_and_only_inward_layer_edges(
    generated: dict[str, str],
) -> None:
    picture = generated["subsystems"]
    for sub in ("store", "tools", "providers", "execution", "http"):
        assert f'"{sub}/"]' in picture
    layer = {"domain": 0, "application": 1, "projections": 2, "interface": 3}
    for source, target in docgen.import_edges():
        outer, inner = source.split(".")[0], target.split(".")[0]
        assert layer[outer] >= layer[inner], f"{source} imports {target}"
    assert not [e for e in docgen.import_edges() if e[0].startswith("domain")]
