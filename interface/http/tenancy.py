"""Which namespace a request reaches, and what its token may do there.

Without a tenants file the app serves one namespace (``TURNLOG_NAMESPACE``)
with one shared token, or none. With ``TURNLOG_TENANTS_FILE`` it serves every
namespace the file names, each with its own ``AppState`` (its own process:
runtime, read models, worker and runners), and the bearer token decides:

- its hash names a grant (namespace and role), else 401;
- an ``admin`` token picks any served namespace with ``X-Turnlog-Namespace``
  (its own by default); any other token only its own: a header naming another
  is 404 ``namespace_not_found``, as for a namespace that does not exist;
- the route's method and template decide the role it needs (``needed``),
  else 403 ``role_forbidden``.

All of it is decided in ``TokenMiddleware``, before a body is read. The
file is read again on SIGHUP (``reload``); a bad file keeps the previous one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from turnlog.application.errors import ConfigurationError
from turnlog.application.tenants import Access, Grant, Tenants, load_tenants
from turnlog.interface.http.state import AppState
from turnlog.interface.metrics import NamespaceLabelled

log = logging.getLogger("turnlog.tenants")

NAMESPACE_HEADER = b"x-turnlog-namespace"

# The routes an operator's role is needed for (besides every read and write a client may do).
OPERATOR_ROUTES = frozenset(
    {
        "/v1/sessions/{session_id}/turns/{turn_id}/abandon",
        "/v1/sessions/{session_id}/turns/{turn_id}/cancel",
        "/v1/sessions/{session_id}/tool-calls/{call_id}/resolve",
        "/v1/sessions/{session_id}/tool-calls/{call_id}/approve",
        "/v1/sessions/{session_id}/tool-calls/{call_id}/reject",
        "/v1/sessions/{session_id}/purge",
    }
)


def needed(method: str, template: str) -> Access:
    """The least role a request needs: reads for readers, operator routes, the rest clients."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return Access.READER
    if template in OPERATOR_ROUTES:
        return Access.OPERATOR
    return Access.CLIENT


@dataclass
class Tenancy:
    """The namespaces an app serves, and (with a tenants file) who may reach which."""

    states: dict[str, AppState]
    default: str
    path: Path | None = None
    tenants: Tenants | None = None
    reloads: int = field(default=0)

    @property
    def multi(self) -> bool:
        return self.tenants is not None

    def state(self, namespace: str | None) -> AppState:
        return self.states[namespace or self.default]

    def all(self) -> Iterable[tuple[str, AppState]]:
        return self.states.items()

    def grant_for(self, token: bytes) -> Grant | None:
        tenants = self.tenants
        return tenants.grant_for(token) if tenants is not None else None

    def namespace_for(self, grant: Grant, asked: str | None) -> str | None:
        """The namespace a request of ``grant`` reaches (None: not one it may see)."""
        if asked is None or asked == grant.namespace:
            wanted = grant.namespace
        elif grant.access is Access.ADMIN:
            wanted = asked
        else:
            return None
        return wanted if wanted in self.states else None

    def reachable(self, grant: Grant) -> list[str]:
        if grant.access is Access.ADMIN:
            return sorted(self.states)
        return [grant.namespace] if grant.namespace in self.states else []

    def reload(self) -> bool:
        """Read the tenants file again; keep the previous one (and say why) if it is bad."""
        if self.path is None:
            return False
        try:
            tenants = load_tenants(self.path)
            unserved = sorted(set(tenants.namespaces) - set(self.states))
            if unserved:
                raise ConfigurationError(
                    f"{self.path}: names namespaces this server does not serve: "
                    f"{', '.join(unserved)} (a new namespace needs a restart)"
                )
        except ConfigurationError as exc:
            log.error("tenants file not reloaded, the previous one stays: %s", exc.detail)
            return False
        self.tenants = tenants
        self.reloads += 1
        log.info(
            "tenants file reloaded: %d tokens, %d namespaces",
            len(tenants.grants),
            len(tenants.namespaces),
        )
        return True

    def observe(
        self, method: str, route: str, status: int, seconds: float, namespace: str | None
    ) -> None:
        """Count a request in its namespace's registry (the default one's when it has none)."""
        self.state(namespace).metrics.observe(method, route, status, seconds)

    def render_metrics(self) -> bytes:
        """Every namespace's metrics in one exposition, each sample labelled with its namespace."""
        if not self.multi:
            return self.state(None).metrics.render()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(NamespaceLabelled([(ns, s.metrics.registry) for ns, s in self.all()]))
        return generate_latest(registry)
