"""The topic vocabulary of the log: which events are steps, work, or a turn's end.

One owner for what the notifier, the worker and the waits each need to know
of a topic: the recorder reads it here itself, and the news feed
(``application.news``) names its kinds of news by the same letters.
"""

from __future__ import annotations

from collections.abc import Sequence

from turnlog.domain.session import Session

# The middle steps of a running turn. Nobody in another process waits for one
# (a turn's end, a submission and every operator's command are what wake
# waiters and workers), so a save of these alone is notified a little later,
# together with the next (recorder.Notifier): read models and live event
# streams of other processes see them up to recorder.DEFER late.
STEP_TOPICS = frozenset(
    event.TOPIC
    for event in (
        Session.TurnClaimed,
        Session.ModelReplied,
        Session.ToolCallStarted,
        Session.ToolCallProcessStarted,
        Session.ToolCallSucceeded,
        Session.ToolCallFailed,
    )
)

_SUBMITTED = frozenset({Session.TurnSubmitted.TOPIC})


def claimed_submission(topics: Sequence[str]) -> bool:
    """Whether a save is a submission claimed in its own save (``Executor.submit_and_run``).

    Its submitter runs the turn: no other process has anything to take from
    it, so it is a middle step (``deferrable``) and its notification carries
    no hint of work.
    """
    return set(topics) - STEP_TOPICS == _SUBMITTED and Session.TurnClaimed.TOPIC in topics


def deferrable(topics: Sequence[str]) -> bool:
    """Whether a save of events of ``topics`` is a middle step of a running turn (see above)."""
    return bool(topics) and (set(topics) <= STEP_TOPICS or claimed_submission(topics))


# Events after which a session may have a turn for a worker to take.
WORK_TOPICS = frozenset(
    event.TOPIC
    for event in (
        Session.TurnSubmitted,
        Session.ToolCallResolved,
        # A cancel asked of a turn whose owner is gone; a turn cancelled at once
        # (the next queued one may start); an approval or rejection (the turn runs again).
        Session.CancelRequested,
        Session.TurnCancelled,
        Session.ToolCallApproved,
        Session.ToolCallRejected,
    )
)

# Events after which a turn may be finished (a ``?wait`` on it reads it again).
ENDING_TOPICS = frozenset(
    event.TOPIC
    for event in (
        Session.TurnCompleted,
        Session.TurnFailed,
        Session.TurnInterrupted,
        Session.TurnAbandoned,
        Session.TurnCancelled,
    )
)

# The kinds of news, one letter each. A notification's hints carry the first two
# (recorder.Hint): other processes act on them before their follower reads the log.
WORK_MARK = "w"  # a turn to take (WORK_TOPICS): the worker
ENDING_MARK = "e"  # a turn's end (ENDING_TOPICS): ``?wait``
CHANGE_MARK = "c"  # any new event (live streams); never in a hint: pages tell it
PURGE_MARK = "p"  # a session was purged (application.purge): only ever a hint
HINT_MARKS = {
    topic: (WORK_MARK if topic in WORK_TOPICS else "")
    + (ENDING_MARK if topic in ENDING_TOPICS else "")
    for topic in WORK_TOPICS | ENDING_TOPICS
}


def marks_of(topic: str) -> str:
    """The kinds of news an event of ``topic`` is: every event is a change."""
    return HINT_MARKS.get(topic, "") + CHANGE_MARK
