"""How long a runner lets the follower's pages gather: short after a pause, longer in a stream."""

from __future__ import annotations

from turnlog.projections.runner import GATHER, GATHER_BUSY, gather_window


def test_the_first_page_after_a_pause_is_folded_soon() -> None:
    assert gather_window(first=100.0, folded_at=100.0 - GATHER_BUSY - 0.001) == GATHER
    assert gather_window(first=100.0, folded_at=0.0) == GATHER  # never folded yet


def test_pages_that_stream_in_gather_longer_into_fewer_batches() -> None:
    assert gather_window(first=100.0, folded_at=99.995) == GATHER_BUSY
    assert GATHER < GATHER_BUSY <= 0.05  # the lag it adds stays far below a second
