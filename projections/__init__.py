"""Read models: tables kept up to date from the event log, exactly once per event.

Three read models, one module each (``sessions_view``, ``open_turns``,
``tool_calls``); ``supervisor`` keeps them up to date (``ProjectionSupervisor``,
its thread in ``runner``, each lead in ``leadership``),
``queries`` reads them (``ReadModels``), ``rebuild`` rebuilds and verifies
them, and ``audit`` checks a session's stored stream against all of it.
"""

from turnlog.projections.catalog import READ_MODELS, ReadModel, read_models
from turnlog.projections.queries import ReadModels
from turnlog.projections.status import projection_status
from turnlog.projections.supervisor import ProjectionSupervisor

__all__ = [
    "READ_MODELS",
    "ProjectionSupervisor",
    "ReadModel",
    "ReadModels",
    "projection_status",
    "read_models",
]
