"""Tenants files for tests, and request bodies made from the OpenAPI document."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from turnlog.application.settings import Settings, schema_name
from turnlog.application.store.database import Database
from turnlog.application.tenants import token_hash


@dataclass
class TenantsFile:
    """A tenants file being written: tokens (name → (token, namespace, role)) and quotas."""

    path: Path
    tokens: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    quotas: dict[str, dict[str, int]] = field(default_factory=dict)

    def token(self, name: str, namespace: str, role: str) -> str:
        secret = f"tok-{name}-{namespace}"
        self.tokens[name] = (secret, namespace, role)
        return secret

    def write(self) -> Path:
        lines: list[str] = []
        for name, (secret, namespace, role) in self.tokens.items():
            lines += [
                "[[tokens]]",
                f'name = "{name}"',
                f'sha256 = "{token_hash(secret)}"',
                f'namespace = "{namespace}"',
                f'role = "{role}"',
                "",
            ]
        for namespace, table in self.quotas.items():
            lines.append(f"[namespaces.{namespace}]")
            lines += [f"{key} = {value}" for key, value in table.items()]
            lines.append("")
        self.path.write_text("\n".join(lines))
        return self.path

    def headers(self, name: str, namespace: str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.tokens[name][0]}"}
        if namespace is not None:
            headers["X-Turnlog-Namespace"] = namespace
        return headers


def tenant_settings(database: Database, file: TenantsFile, namespace: str) -> Settings:
    """Settings of a server over ``file`` (written now), its data beside the file."""
    return Settings(
        database_url=database.conninfo,
        namespace=namespace,
        data_dir=file.path.parent / "data",
        probes=False,
        tenants_file=file.write(),
    )


def drop_namespaces(database: Database, names: Iterable[str]) -> None:
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        for name in names:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    sql.Identifier(schema_name(name))
                )
            )


PATH_PARAM = re.compile(r"\{([a-z_]+)\}")


def operations(spec: dict[str, Any], prefix: str = "/v1") -> list[tuple[str, str, dict[str, Any]]]:
    """Every (method, path template, operation) of the document under ``prefix``."""
    found = []
    for path, methods in spec["paths"].items():
        if path.startswith(prefix):
            for method, operation in methods.items():
                found.append((method.upper(), path, operation))
    return sorted(found, key=lambda o: (o[1], o[0]))


def fill(path: str, values: dict[str, str]) -> str:
    return PATH_PARAM.sub(lambda m: values[m.group(1)], path)


def body_for(spec: dict[str, Any], operation: dict[str, Any]) -> Any:
    """A smallest valid body for ``operation`` (None when it takes none)."""
    content = operation.get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema")
    return None if schema is None else example(spec, schema)


def query_for(spec: dict[str, Any], operation: dict[str, Any]) -> dict[str, Any]:
    """The required query parameters of ``operation``, with smallest valid values."""
    return {
        p["name"]: example(spec, p.get("schema", {}))
        for p in operation.get("parameters", [])
        if p.get("in") == "query" and p.get("required")
    }


def example(spec: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A value that satisfies ``schema``: required properties only, smallest values."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return example(spec, spec["components"]["schemas"][name])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"]
            return example(spec, options[0])
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type", "object")
    if kind == "object":
        properties = schema.get("properties", {})
        return {
            name: example(spec, properties[name])
            for name in schema.get("required", [])
            if name in properties
        }
    if kind == "string":
        return "x" * max(1, int(schema.get("minLength", 1)))
    if kind in ("integer", "number"):
        return schema.get("minimum", schema.get("exclusiveMinimum", 0) + 1)
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    raise AssertionError(f"no example for {schema}")
