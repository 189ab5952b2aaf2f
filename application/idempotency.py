"""Idempotent session creation: a repeated key finds the session it created.

Turns carry their idempotency key in the domain (TurnSubmitted). A session
has no earlier state to keep a key in, so the key *is* its identity: the
session id is a UUIDv5 of (namespace, key), and the request's fingerprint is
stored in the metadata of its Started event. A repeat with the same body finds the
session; a repeat with a different body is refused; two racing first
requests meet at the library's optimistic concurrency on version 1.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid5

from eventsourcing.persistence import IntegrityError

from turnlog.application.errors import SessionNotFound
from turnlog.application.sessions import Sessions, Written
from turnlog.application.store.history import History
from turnlog.domain.errors import IdempotencyKeyReused

METADATA_KEY = "turnlog.idempotency"
_KEYS = UUID("5b0f6d5e-4d7e-4f0e-9a53-8c1f0c7a1d2e")


@dataclass(frozen=True)
class Started:
    """The session a creation request stands for, and whether this request created it."""

    written: Written
    created: bool


def fingerprint(request: Mapping[str, Any]) -> str:
    """A stable hash of a request body (key order does not matter)."""
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def session_id_for(namespace: str, key: str) -> UUID:
    """The session id an idempotency key stands for in a namespace."""
    return uuid5(_KEYS, f"{namespace}\x00{key}")


def start_session_once(
    sessions: Sessions, namespace: str, key: str, request: Mapping[str, Any], **fields: Any
) -> Started:
    """Create the session for ``key``, or return the one an identical request created."""
    metadata = dict(fields.pop("metadata", {}))

    def create(session_id: UUID, mark: dict[str, Any]) -> Written:
        return sessions.create_session(
            session_id=session_id, metadata={**metadata, **mark}, **fields
        )

    return start_once(sessions, namespace, key, request, create)


def start_once(
    sessions: Sessions,
    namespace: str,
    key: str,
    request: Mapping[str, Any],
    create: Callable[[UUID, dict[str, Any]], Written],
) -> Started:
    """Start the session for ``key`` with ``create(session_id, mark)``, or return the one
    an identical request started; ``mark`` goes into the new session's metadata."""
    session_id = session_id_for(namespace, key)
    digest = fingerprint(request)
    for _ in (1, 2):
        found = _existing(sessions, session_id, key, digest)
        if found is not None:
            return found
        try:
            written = create(session_id, {METADATA_KEY: {"key": key, "sha256": digest}})
        except IntegrityError:
            # A concurrent request with the same key stored version 1 first:
            # compare with what it stored.
            continue
        return Started(written, created=True)
    raise AssertionError("unreachable: version 1 exists after a conflict on it")


def _existing(sessions: Sessions, session_id: UUID, key: str, digest: str) -> Started | None:
    try:
        session = sessions.get_session(session_id)
    except SessionNotFound:
        return None
    stored = session.metadata.get(METADATA_KEY) or {}
    if stored.get("sha256") != digest:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used to create a session with a different body",
            session_id=str(session_id),
        )
    position = History(sessions).position_at(session_id, 1)
    return Started(Written(session.id, session.version, position), created=False)
