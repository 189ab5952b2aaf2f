"""What one ``turnlog serve`` process runs, by role (``interface.bootstrap`` builds it).

``all`` runs the HTTP API, a worker and the projection runners in one
process (the simple default); ``api``, ``worker`` and ``projections`` split
them (``serve --split`` runs ``api`` with the other two as its children,
``interface.children``). Every role builds the runtime (which prepares the namespace) and
nothing that replays the log: the worker starts from the open-turns read
model, projections resume from their tracking positions, and the API reads
sessions one by one on demand.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """Which parts a serve process runs."""

    ALL = "all"
    API = "api"
    WORKER = "worker"
    PROJECTIONS = "projections"

    @property
    def serves_api(self) -> bool:
        return self in (Role.ALL, Role.API)

    @property
    def runs_worker(self) -> bool:
        return self in (Role.ALL, Role.WORKER)

    @property
    def runs_projections(self) -> bool:
        return self in (Role.ALL, Role.PROJECTIONS)
