"""turnlog: an agent runtime whose sessions are event streams in PostgreSQL.

The four layers are installed under this one import name, so nothing generic
lands beside a user's own code: ``turnlog.domain``, ``turnlog.application``,
``turnlog.projections`` and ``turnlog.interface``. In the repository they are
the top-level folders of the same names (this package links to them).

The public surface is what this module exports (``__all__``); everything else
may change between versions.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("turnlog")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

# Public name → the module that defines it, imported on first use so that
# ``import turnlog`` stays cheap (no web framework, no database driver).
_LAZY = {
    "Client": "turnlog.interface.client",
    "AsyncClient": "turnlog.interface.client",
    "RetryPolicy": "turnlog.interface.client",
    "TurnlogError": "turnlog.interface.client",
    "TurnWaitTimeout": "turnlog.interface.client",
    "ApiError": "turnlog.interface.client",
    "NotATurnlogServer": "turnlog.interface.client",
    "ServerUnreachable": "turnlog.interface.client",
    "models": "turnlog.interface.client.models",
    "tool": "turnlog.application.tools.python",
}

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "NotATurnlogServer",
    "RetryPolicy",
    "ServerUnreachable",
    "TurnWaitTimeout",
    "TurnlogError",
    "__version__",
    "models",
    "tool",
]

if TYPE_CHECKING:
    from turnlog.application.tools.python import tool
    from turnlog.interface.client import (
        ApiError,
        AsyncClient,
        Client,
        NotATurnlogServer,
        RetryPolicy,
        ServerUnreachable,
        TurnlogError,
        TurnWaitTimeout,
        models,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'turnlog' has no attribute {name!r}")
    value = import_module(module) if name == "models" else getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
