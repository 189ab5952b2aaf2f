"""The sessions read model's search index holds titles of any length.

A btree entry holds at most about 2.7 kB: indexed whole, a longer title (the
CLI and the Python API take any length) failed its row's write, and with it
every later batch of the read model.
"""

from __future__ import annotations

import random
import string

from turnlog.application.runtime import Runtime
from turnlog.projections import ReadModels, queries, read_models, sessions_view
from turnlog.projections.rebuild import rebuild


def test_a_title_longer_than_an_index_entry_is_stored_and_found_by_its_start(
    runtime: Runtime,
) -> None:
    rng = random.Random(39)
    title = "".join(rng.choice(string.ascii_letters) for _ in range(12_000))  # incompressible
    read = ReadModels(runtime.db, runtime.settings, sessions=runtime.sessions)
    long = runtime.sessions.create_session(title=title).session_id
    runtime.sessions.create_session(title="after it")
    rebuild(read.events, runtime.db, runtime.settings.namespace, read_models())

    assert [r["title"] for r in read.list_sessions()[0]] == ["after it", title]
    longest = title[: queries.MAX_SEARCH_CHARS]
    for text in (title[:3].upper(), longest):
        [found] = read.list_sessions(search=text)[0]
        assert found["session_id"] == str(long)
    assert read.list_sessions(search=longest[:-1] + "#")[0] == []


def test_the_indexed_part_of_a_title_is_as_long_as_the_longest_search() -> None:
    assert queries.MAX_SEARCH_CHARS <= sessions_view.TITLE_PREFIX_CHARS
