"""Forking a session: a new session that goes on from another as it was at one version.

The fork's first event (``Session.Forked``) names the source, the version
and the source's chain head there, and carries what the fork's requests
need (the source's settings, the context summary in force, the finished
turns the next request carries, in full): the fork's next request equals
the source's ``request_at(version)``, and the fork never reads the source
again, so it outlives a purge of it. The source is only read.
See docs/fork.md.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from turnlog.application.sessions import Sessions, Written
from turnlog.application.store import session_log
from turnlog.domain.session import Session

RESERVED = "turnlog."  # metadata keys the runtime itself writes (an idempotency key's record)


def fork_session(
    sessions: Sessions,
    source_id: UUID,
    version: int,
    *,
    title: str | None = None,
    metadata: dict[str, Any] | None = None,
    created_by: str = "",
    session_id: UUID | None = None,
    mark: dict[str, Any] | None = None,
) -> Written:
    """Start a session from ``source_id`` at ``version``; returns what was written.

    404 / 410 for a source with no events, 422 ``invalid_version`` for a
    version it never had, 409 ``fork_inside_turn`` /
    ``fork_at_interrupted_turn`` for one inside an unfinished turn. Omitted
    ``metadata`` is the source's but for its ``turnlog.`` keys; ``mark`` is added
    to it (an idempotency key's record); ``session_id``: the fork's id.
    """
    source, earlier = sessions.at_version(source_id, version)
    head = session_log.hash_at(sessions.recorder, source_id, version)
    if metadata is None:  # the source's, without what the runtime keeps there
        metadata = {k: v for k, v in source.metadata.items() if not k.startswith(RESERVED)}
    fork = Session.fork(
        source,
        earlier,
        version=version,
        head=head,
        title=title,
        metadata={**metadata, **(mark or {})},
        created_by=created_by,
        session_id=session_id,
    )
    return sessions.save_new(fork)  # a lost commit is read back (store.lost_commits)
