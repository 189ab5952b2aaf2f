"""The tenants file is refused whole, naming the entry, when it breaks a rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from turnlog.application.errors import ConfigurationError
from turnlog.application.tenants import Access, load_tenants, parse_tenants, token_hash

GOOD = {"sha256": token_hash("s3cret"), "namespace": "team_a", "role": "client"}


def test_a_good_file_maps_a_tokens_hash_to_its_namespace_and_role(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(
        f'[[tokens]]\nname = "ci"\nsha256 = "{token_hash("s3cret")}"\n'
        'namespace = "team_a"\nrole = "operator"\n\n'
        "[namespaces.team_b]\nmax_sessions = 3\nturns_per_minute = 0\n"
    )
    tenants = load_tenants(path)
    grant = tenants.grant_for("s3cret")
    assert grant is not None and (grant.namespace, grant.access) == ("team_a", Access.OPERATOR)
    assert tenants.grant_for("s3cre") is None and tenants.grant_for("") is None
    assert tenants.namespaces == ("team_a", "team_b")
    assert tenants.quotas_of("team_b").set() == {"max_sessions": 3, "turns_per_minute": 0}
    assert tenants.quotas_of("team_a").set() == {}
    assert "s3cret" not in repr(tenants)


@pytest.mark.parametrize(
    ("document", "names"),
    [
        ({"tokens": [{"namespace": "team_a", "role": "client"}]}, ["tokens[0]", "no sha256"]),
        ({"tokens": [{**GOOD, "name": "bob", "role": "root"}]}, ["tokens[0] (bob)", "root"]),
        ({"tokens": [{**GOOD, "namespace": "Team-A"}]}, ["tokens[0]", "Team-A"]),
        ({"tokens": [GOOD], "namespaces": {"9x": {}}}, ["namespaces.9x", "identifier"]),
        (
            {"tokens": [GOOD], "namespaces": {"team_a": {"max_sessions": -1}}},
            ["namespaces.team_a.max_sessions", "negative"],
        ),
        (
            {"tokens": [GOOD], "namespaces": {"team_a": {"max_turns": 1}}},
            ["namespaces.team_a", "unknown keys"],
        ),
        (
            {"tokens": [{**GOOD, "name": "one"}, {**GOOD, "name": "two"}]},
            ["tokens[1] (two)", "same sha256 as one"],
        ),
        ({"tokens": [{**GOOD, "sha256": "abc"}]}, ["tokens[0]", "64 hexadecimal"]),
        ({"tokens": [{**GOOD, "token": "s3cret"}]}, ["tokens[0]", "unknown keys ['token']"]),
        ({"tokens": []}, ["names no token"]),
    ],
)
def test_a_bad_file_is_refused_naming_the_entry(document: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(ConfigurationError) as refused:
        parse_tenants(document, "tenants.toml")
    for name in names:
        assert name in refused.value.detail


def test_a_file_that_is_not_toml_or_not_there_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tokens]\n")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        load_tenants(bad)
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_tenants(tmp_path / "missing.toml")
