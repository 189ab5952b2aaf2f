"""The tenants file: tokens bound to a namespace and a role, and each namespace's quotas.

``TURNLOG_TENANTS_FILE`` names a TOML file::

    [[tokens]]
    name = "team-a ci"                 # optional; shown in logs and errors
    sha256 = "9f86d08…"                # hex SHA-256 of the token; the token itself is never stored
    namespace = "team_a"
    role = "client"                    # reader | client | operator | admin

    [namespaces.team_a]
    database_url = "postgresql://…"   # optional: the namespace's own cluster
    max_running_turns = 8
    turns_per_minute = 120
    max_sessions = 10000
    max_stored_bytes = 10_000_000_000

Every namespace named by a token or a ``[namespaces.*]`` table is served. An
``admin`` token reaches every namespace (its own ``namespace`` is the one it
gets by default). A file that breaks a rule is refused whole, naming the entry.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from turnlog.application.errors import ConfigurationError
from turnlog.application.settings import NAMESPACE_PATTERN, Settings

_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")


class Access(StrEnum):
    """What a token may do, each level including the ones before it."""

    READER = "reader"  # reads only
    CLIENT = "client"  # also sessions and turns
    OPERATOR = "operator"  # also abandon, resolve, approve, reject, cancel, purge
    ADMIN = "admin"  # all of it, in every namespace

    @property
    def rank(self) -> int:
        return list(Access).index(self)

    def allows(self, needed: Access) -> bool:
        return self.rank >= needed.rank


@dataclass(frozen=True)
class Grant:
    """What one token holds."""

    name: str
    namespace: str
    access: Access


@dataclass(frozen=True)
class Quotas:
    """A namespace's limits; None is no limit."""

    max_running_turns: int | None = None
    turns_per_minute: int | None = None
    max_sessions: int | None = None
    max_stored_bytes: int | None = None

    def set(self) -> dict[str, int]:
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


@dataclass(frozen=True)
class Tenants:
    """The parsed file: tokens by their hash, and quotas by namespace."""

    grants: Mapping[str, Grant] = field(default_factory=dict)
    quotas: Mapping[str, Quotas] = field(default_factory=dict)
    source: str = ""
    # A namespace's own PostgreSQL (another cluster), beside TURNLOG_NAMESPACE_DATABASE_URLS.
    database_urls: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace the file names, sorted."""
        names = set(self.quotas) | {g.namespace for g in self.grants.values()}
        return tuple(sorted(names))

    def grant_for(self, token: str | bytes) -> Grant | None:
        """The grant of a presented token, or None. Only hashes are compared."""
        raw = token.encode() if isinstance(token, str) else token
        if not raw:
            return None
        # Looked up by its hash: a guess learns nothing from the time a lookup takes.
        return self.grants.get(hashlib.sha256(raw).hexdigest())

    def quotas_of(self, namespace: str) -> Quotas:
        return self.quotas.get(namespace, Quotas())


def token_hash(token: str) -> str:
    """The ``sha256`` value a tenants file holds for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


def load_tenants(path: Path) -> Tenants:
    """Read and check the tenants file; ConfigurationError names the first bad entry."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read the tenants file {path}: {exc.strerror}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"the tenants file {path} is not valid TOML: {exc}") from None
    return parse_tenants(document, str(path))


_TOKEN_KEYS = {"name", "sha256", "namespace", "role"}
_TOP_KEYS = {"tokens", "namespaces"}


def parse_tenants(document: Mapping[str, Any], source: str = "tenants file") -> Tenants:
    """Check a parsed tenants document (see the module's docstring for its shape)."""
    unknown = sorted(set(document) - _TOP_KEYS)
    if unknown:
        raise _bad(
            source, "", f"unknown top-level keys {unknown}; expected [[tokens]], [namespaces]"
        )
    grants: dict[str, Grant] = {}
    tokens = document.get("tokens", [])
    if not isinstance(tokens, list):
        raise _bad(source, "tokens", "must be an array of tables ([[tokens]])")
    for index, entry in enumerate(tokens):
        where = f"tokens[{index}]"
        if not isinstance(entry, dict):
            raise _bad(source, where, "must be a table")
        name = entry.get("name", where)
        if not isinstance(name, str) or not name:
            raise _bad(source, where, "name must be a non-empty string")
        where = f"{where} ({name})" if name != where else where
        extra = sorted(set(entry) - _TOKEN_KEYS)
        if extra:
            raise _bad(source, where, f"unknown keys {extra}; expected {sorted(_TOKEN_KEYS)}")
        digest = entry.get("sha256")
        if digest is None:
            raise _bad(source, where, "has no sha256 (the token's hex SHA-256; never the token)")
        if not isinstance(digest, str) or not _HEX_SHA256.fullmatch(digest.lower()):
            raise _bad(source, where, "sha256 must be 64 hexadecimal characters")
        digest = digest.lower()
        if digest in grants:
            raise _bad(source, where, f"has the same sha256 as {grants[digest].name}")
        namespace = entry.get("namespace")
        if not isinstance(namespace, str):
            raise _bad(source, where, "needs a namespace")
        _check_namespace(source, where, namespace)
        role = entry.get("role")
        try:
            access = Access(str(role))
        except ValueError:
            known = ", ".join(a.value for a in Access)
            raise _bad(source, where, f"unknown role {role!r}; use one of {known}") from None
        grants[digest] = Grant(name, namespace, access)
    quotas: dict[str, Quotas] = {}
    tables = document.get("namespaces", {})
    if not isinstance(tables, dict):
        raise _bad(source, "namespaces", "must be a table of tables ([namespaces.NAME])")
    allowed = {f.name for f in fields(Quotas)}
    urls: dict[str, str] = {}
    for namespace, table in tables.items():
        where = f"namespaces.{namespace}"
        _check_namespace(source, where, namespace)
        if not isinstance(table, dict):
            raise _bad(source, where, "must be a table")
        table = dict(table)
        url = table.pop("database_url", None)
        if url is not None:
            if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
                raise _bad(source, f"{where}.database_url", "must be a postgresql:// URL")
            urls[namespace] = url
        extra = sorted(set(table) - allowed)
        if extra:
            keys = sorted([*allowed, "database_url"])
            raise _bad(source, where, f"unknown keys {extra}; expected {keys}")
        for key, value in table.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad(source, f"{where}.{key}", "must be an integer")
            if value < 0:
                raise _bad(source, f"{where}.{key}", f"must not be negative (got {value})")
        quotas[namespace] = Quotas(**table)
    if not grants:
        raise _bad(source, "tokens", "names no token: nobody could use the server")
    return Tenants(grants, quotas, source, urls)


def _check_namespace(source: str, where: str, namespace: str) -> None:
    if not NAMESPACE_PATTERN.fullmatch(namespace):
        raise _bad(
            source,
            where,
            f"namespace {namespace!r} is not a valid identifier: a lowercase letter followed"
            " by up to 39 lowercase letters, digits or underscores",
        )


def _bad(source: str, where: str, why: str) -> ConfigurationError:
    at = f" {where}" if where else ""
    return ConfigurationError(f"{source}:{at} {why}", entry=where)


def scoped_settings(settings: Settings, tenants: Tenants | None = None) -> list[Settings]:
    """The settings of each namespace a process serves: the tenants file's, or the one.

    Without a tenants file that is ``settings`` itself. With one, a copy for each
    namespace, with the file's ``database_url``s added to the namespace URLs; the
    configured namespace, when the file names it, comes first.
    """
    if settings.tenants_file is None:
        return [settings]
    if settings.api_token is not None:
        raise ConfigurationError(
            "set TURNLOG_API_TOKEN or TURNLOG_TENANTS_FILE, not both: with a tenants file"
            " every token is one of its entries"
        )
    tenants = tenants or load_tenants(settings.tenants_file)
    urls = {**settings.namespace_database_urls, **tenants.database_urls}
    names = sorted(tenants.namespaces, key=lambda ns: (ns != settings.namespace, ns))
    return [
        settings.model_copy(update={"namespace": ns, "namespace_database_urls": urls})
        for ns in names
    ]
