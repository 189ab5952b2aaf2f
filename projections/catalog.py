"""The read models by name: each one's projection, Postgres view and table."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from eventsourcing.postgres import PostgresDatastore
from eventsourcing.projection import Projection

from turnlog.application.errors import UnknownProjection
from turnlog.projections.open_turns import OpenTurnsProjection, PostgresOpenTurnsView
from turnlog.projections.rows import Table
from turnlog.projections.sessions_view import PostgresSessionsView, SessionsProjection
from turnlog.projections.tool_calls import PostgresToolCallsView, ToolCallsProjection
from turnlog.projections.view import MemoryView, PostgresReadModelView, ReadModelView


@dataclass(frozen=True)
class ReadModel:
    """A read model: its public name, its projection and its Postgres view."""

    name: str
    projection: type[Projection[ReadModelView]]
    view: type[PostgresReadModelView]

    @property
    def table(self) -> Table:
        return self.view.table

    @property
    def tracking_table(self) -> str:
        # As the library's factory names it: after the projection.
        return f"{self.projection.name.lower()}_tracking"

    def postgres_view(self, datastore: PostgresDatastore) -> PostgresReadModelView:
        return self.view(datastore, tracking_table_name=self.tracking_table)

    def memory_view(self) -> MemoryView:
        return MemoryView(self.table)


READ_MODELS: dict[str, ReadModel] = {
    model.name: model
    for model in (
        ReadModel("sessions", SessionsProjection, PostgresSessionsView),
        ReadModel("open_turns", OpenTurnsProjection, PostgresOpenTurnsView),
        ReadModel("tool_calls", ToolCallsProjection, PostgresToolCallsView),
    )
}


def read_models(names: str | Iterable[str] | None = None) -> list[ReadModel]:
    """The named read models (all of them for None or an empty list), in catalog order."""
    if names is None:
        return list(READ_MODELS.values())
    wanted = [names] if isinstance(names, str) else list(names)
    if not wanted:
        return list(READ_MODELS.values())
    unknown = [n for n in wanted if n not in READ_MODELS]
    if unknown:
        raise UnknownProjection(
            f"no read model named {', '.join(map(repr, unknown))}; known: {', '.join(READ_MODELS)}"
        )
    return [model for name, model in READ_MODELS.items() if name in wanted]
