"""The news feed: each piece of news once to each subscriber, whichever source brings it first.

A save reaches a process three ways: its own commit (``saved``), another
process's notification hints (``hints``) and the follower's page of the log
(``page``). Every order of the three delivers the save's work once.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from uuid import UUID

import pytest

from tests.deadlines import poll
from turnlog.application.news import News, NewsFeed
from turnlog.application.runtime import Runtime
from turnlog.application.store.follower import LogFollower
from turnlog.application.store.logorder import LogPage
from turnlog.application.store.recorder import Hint
from turnlog.application.store.topics import CHANGE_MARK, ENDING_MARK, WORK_MARK


def _sources(runtime: Runtime, session_id: UUID) -> dict[str, Callable[[NewsFeed], None]]:
    """The three ways the session's stored events can reach a feed, each as a call."""
    events = list(runtime.sessions.events.get(session_id))
    pages: list[LogPage] = []
    reader = LogFollower(runtime.sessions, runtime.db)  # not started: reads from the start
    reader.subscribe(pages.append)
    last = events[-1].originator_version

    def read_to_last() -> bool:
        # Another test's open transaction may hold the commit horizon back a moment.
        reader.read()
        return any(
            n.originator_id == session_id and n.originator_version == last
            for page in pages
            for _, n in page.records
        )

    poll(read_to_last, 20, "the session's events below the horizon")
    # One page, as one read finds them all once the horizon has passed both commits
    # (another test's transaction may have split them over two reads).
    records = [r for page in pages for r in page.records if r[1].originator_id == session_id]
    mine = [dataclasses.replace(pages[-1], records=records, after=pages[0].after)]
    return {
        "save": lambda feed: feed.saved(session_id, events),
        "hint": lambda feed: feed.hints([Hint(session_id, WORK_MARK, last)]),
        "page": lambda feed: [feed.page(page) for page in mine] and None,
    }


@pytest.mark.parametrize("order", list(itertools.permutations(["save", "hint", "page"])))
def test_one_save_is_delivered_once_to_each_subscriber_whichever_source_comes_first(
    runtime: Runtime, order: tuple[str, ...]
) -> None:
    written = runtime.sessions.create_session(title="news")
    submitted = runtime.sessions.submit_turn(written.session_id, "hello")
    sources = _sources(runtime, written.session_id)
    feed = NewsFeed()
    worker: list[News] = []
    waits: list[News] = []
    feed.subscribe(worker.extend, WORK_MARK)
    feed.subscribe(waits.extend, ENDING_MARK + CHANGE_MARK)

    for source in order:
        sources[source](feed)

    sid = written.session_id
    assert worker == [News(sid, WORK_MARK, submitted.version)]
    assert {(n.mark, n.version) for n in waits} == {(CHANGE_MARK, submitted.version)}
    assert len(waits) <= 2  # the session's start and its submission, told at most once each


def test_news_of_a_later_version_is_delivered_and_a_failing_listener_stops_no_other() -> None:
    feed = NewsFeed()
    told: list[News] = []

    def broken(news: Sequence[News]) -> None:
        raise RuntimeError("a listener's own bug")

    feed.subscribe(broken, WORK_MARK)
    feed.subscribe(told.extend, WORK_MARK)
    sid = UUID(int=7)
    feed.hints([Hint(sid, WORK_MARK, 3)])
    feed.hints([Hint(sid, WORK_MARK, 3)])  # again: not news
    feed.hints([Hint(sid, WORK_MARK + ENDING_MARK, 5)])  # later: news

    assert told == [News(sid, WORK_MARK, 3), News(sid, WORK_MARK, 5)]
    assert feed.dropped == 1


def test_a_hint_a_page_has_told_already_is_not_news_whatever_its_kind_version() -> None:
    """A hint's version is the latest of its marked saves: a work event at 2 and an end at 3
    come as one hint, work at 3; the page told work at 2 and the end at 3 already."""
    feed = NewsFeed()
    told: list[News] = []
    feed.subscribe(told.extend, WORK_MARK + ENDING_MARK)
    sid = UUID(int=9)
    feed._deliver({(sid, WORK_MARK): 2, (sid, ENDING_MARK): 3, (sid, CHANGE_MARK): 3}, "page")
    feed.hints([Hint(sid, WORK_MARK + ENDING_MARK, 3)])

    assert told == [News(sid, WORK_MARK, 2), News(sid, ENDING_MARK, 3)]
