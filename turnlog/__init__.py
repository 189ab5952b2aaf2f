"""turnlog: an agent runtime whose sessions are event streams in PostgreSQL.

The four layers are installed under this one import name, so nothing generic
lands beside a user's own code: ``turnlog.domain``, ``turnlog.application``,
``turnlog.projections`` and ``turnlog.interface``. In the repository they are
the top-level folders of the same names (this package links to them).

The public surface is what this module exports (``__all__``); everything else
may change between versions.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("turnlog")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
