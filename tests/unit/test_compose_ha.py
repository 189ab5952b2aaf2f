"""docker/compose.ha.yaml, checked without a Docker engine (no images can be pulled here).

Three Patroni nodes on one etcd, synchronous replication on, and turnlog's
roles on the multi-host URL that names all three with
``target_session_attrs=read-write``; commands parsed by the real command
line, variables known, files referenced present.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from psycopg.conninfo import conninfo_to_dict

from tests.unit.test_docker import DOCKER, LONG_RUNNING, resolve, settings_variables

NODES = ("pg1", "pg2", "pg3")
TURNLOG_SERVICES = ("init", "projections", "worker", "api")


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DOCKER / "compose.ha.yaml").read_text())
    return loaded


def services() -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"]
    return found


def test_three_patroni_nodes_on_one_etcd() -> None:
    found = services()
    assert {"etcd", *NODES, *TURNLOG_SERVICES} == set(found)
    names = set()
    for node in NODES:
        env = found[node]["environment"]
        assert env["PATRONI_SCOPE"] == "turnlog"
        assert env["PATRONI_ETCD3_HOSTS"] == "'etcd:2379'"
        assert env["PATRONI_NAME"] == node == found[node]["hostname"]
        assert env["PATRONI_POSTGRESQL_CONNECT_ADDRESS"] == f"{node}:5432"
        assert env["PATRONI_RESTAPI_CONNECT_ADDRESS"] == f"{node}:8008"
        assert found[node]["volumes"] == [f"{node}:/var/lib/postgresql/data"]
        assert "8008/health" in " ".join(found[node]["healthcheck"]["test"])
        names.add(env["PATRONI_NAME"])
    assert len(names) == 3
    assert "--advertise-client-urls=http://etcd:2379" in found["etcd"]["command"]


def test_replication_is_synchronous() -> None:
    config = yaml.safe_load((DOCKER / "patroni" / "patroni.yml").read_text())
    dcs = config["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True and dcs["synchronous_node_count"] == 1
    assert dcs["postgresql"]["parameters"]["synchronous_commit"] == "on"
    script = DOCKER / "patroni" / config["bootstrap"]["post_bootstrap"].rsplit("/", 1)[1]
    assert script.exists() and "CREATE DATABASE" in script.read_text()
    dockerfile = (DOCKER / "patroni" / "Dockerfile").read_text()
    assert "patroni.yml post_bootstrap.sh /etc/patroni/" in dockerfile


def test_turnlog_connects_to_every_node_wanting_the_writable_one() -> None:
    found = services()
    for name in TURNLOG_SERVICES:
        url = found[name]["environment"]["TURNLOG_DATABASE_URL"]
        # ${…} substituted as compose would, with simple values.
        plain = re.sub(r"\$\{([A-Z_]+)(:[-?][^}]*)?\}", lambda m: m.group(1).lower(), url)
        params = conninfo_to_dict(plain)
        assert params["host"] == ",".join(NODES)
        assert params["port"] == "5432,5432,5432"
        assert params["target_session_attrs"] == "read-write"
        assert params["connect_timeout"] == "5"
        depends = found[name].get("depends_on", {})
        assert all(depends[node]["condition"] == "service_healthy" for node in NODES)


def test_the_commands_are_real_and_the_variables_known() -> None:
    found = services()
    for name in TURNLOG_SERVICES:
        resolve(found[name]["command"])
    for name in LONG_RUNNING:
        assert "--role" in found[name]["command"]
    assert found["init"]["restart"] == "on-failure"  # until a leader accepts writes
    text = (DOCKER / "compose.ha.yaml").read_text()
    used = set(re.findall(r"TURNLOG_[A-Z0-9_]+", text))
    assert used <= settings_variables(), sorted(used - settings_variables())
    substituted = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    documented = set(
        re.findall(r"^#?\s*([A-Z0-9_]+)=", (DOCKER / ".env.example").read_text(), re.M)
    )
    assert substituted <= documented, sorted(substituted - documented)
    declared = set(compose()["volumes"])
    for service in found.values():
        for volume in service.get("volumes", []):
            assert volume.split(":", 1)[0] in declared, volume
