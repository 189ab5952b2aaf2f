"""A save whose COMMIT got no answer is settled by reading the stream again, never guessed.

A proxy between turnlog and the server cuts the connection that carries one
save: after the server committed it and before the answer reaches the
writer (the answer lost), or before the server got it (the save lost).
Either way the writer only sees its connection end. The save must then
return as if nothing had happened, with the events stored exactly once:
read back and found (answer lost), or written again (save lost). Before,
the save raised an ``OperationalError`` (a 503 the client retried: a second
session, or with a new key, a second turn).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import raw_events
from tests.deadlines import scaled
from tests.fault.proxy import Proxy
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store import lost_commits
from turnlog.application.store.database import Database
from turnlog.interface.bootstrap import build_runtime


def on_the_wire(text: str) -> bytes:
    """How ``text`` inside an event's state crosses the wire: a save of one stream sends
    its states as binary parameters (``chain.stream_params``), the bytes as they are."""
    return text.encode()


@pytest.fixture
def proxy(database: Database) -> Iterator[Proxy]:
    proxy = Proxy(database.params)
    proxy.up()
    yield proxy
    proxy.down()


@pytest.fixture
def through(settings: Settings, database: Database, proxy: Proxy) -> Iterator[Runtime]:
    params = {**database.params, "host": "127.0.0.1", "port": proxy.port}
    url = " ".join(f"{k}={v}" for k, v in params.items())
    rt = build_runtime(settings.model_copy(update={"database_url": url}))
    yield rt
    rt.close()


@pytest.mark.parametrize(
    ("answered", "outcome"), [(True, "stored"), (False, "not stored: written again")]
)
def test_a_new_session_whose_commit_got_no_answer(
    through: Runtime, proxy: Proxy, database: Database, answered: bool, outcome: str
) -> None:
    marker = f"lost-{uuid.uuid4().hex}"
    before = lost_commits.counts[outcome]
    cut = proxy.lose_at(on_the_wire(marker), answered=answered)

    written = through.sessions.create_session(title=marker)

    assert cut.wait(scaled(5)), "the save did not pass the proxy"
    assert lost_commits.counts[outcome] == before + 1
    rows = raw_events(database, through.settings.namespace, written.session_id)
    assert [r[2] for r in rows] == [1]  # stored once
    assert rows[0][0] == written.position
    assert through.sessions.get_session(written.session_id).title == marker


@pytest.mark.parametrize(
    ("answered", "outcome"), [(True, "stored"), (False, "not stored: written again")]
)
def test_a_submitted_turn_whose_commit_got_no_answer(
    through: Runtime, proxy: Proxy, database: Database, answered: bool, outcome: str
) -> None:
    session = through.sessions.create_session(title="lost turn")
    marker = f"lost-{uuid.uuid4().hex}"
    before = lost_commits.counts[outcome]
    cut = proxy.lose_at(on_the_wire(marker), answered=answered)

    submitted = through.sessions.submit_turn(session.session_id, marker, f"key-{marker}")

    assert cut.wait(scaled(5))
    assert lost_commits.counts[outcome] == before + 1
    topics = [r[3] for r in raw_events(database, through.settings.namespace, session.session_id)]
    assert sum("TurnSubmitted" in t for t in topics) == 1
    stored = through.sessions.get_session(session.session_id)
    assert stored.version == submitted.version == 2
    turn = through.sessions.turn_record(session.session_id, submitted.turn_id)[1]
    assert turn.message == marker
