"""How the state objects in a snapshot are stored: each dataclass as a dict of its fields."""

from __future__ import annotations

import dataclasses
from typing import Any

from eventsourcing.persistence import Transcoding

from turnlog.domain.turns import CallState, ToolCall, Turn, TurnState


class DataclassAsDict(Transcoding):
    """Stores a state dataclass (for snapshots) as a dict of its fields."""

    def __init__(self, cls: type[Any]) -> None:
        self.type = cls
        self.name = f"turnlog.{cls.__name__}.v1"
        self._fields = [f.name for f in dataclasses.fields(cls)]

    def encode(self, obj: Any) -> dict[str, Any]:
        return {name: _plain(getattr(obj, name)) for name in self._fields}

    def decode(self, data: dict[str, Any]) -> Any:
        obj = self.type(**data)
        # Member lookup by value without the enum call's overhead (hot when a
        # long session's snapshot is decoded).
        if isinstance(obj, Turn):
            obj.state = _TURN_STATES[obj.state]
        elif isinstance(obj, ToolCall):
            obj.state = _CALL_STATES[obj.state]
        return obj


_TURN_STATES: dict[str, TurnState] = {s.value: s for s in TurnState}
_CALL_STATES: dict[str, CallState] = {s.value: s for s in CallState}


def _plain(value: Any) -> Any:
    # StrEnum members become plain strings; decode() turns them back.
    return str(value) if isinstance(value, (TurnState, CallState)) else value
