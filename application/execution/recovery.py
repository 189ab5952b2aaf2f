"""How recovery's decisions are worded for people: planned, or carried out.

The decisions themselves, and the rules behind them, are
``domain.progress.decide``.
"""

from __future__ import annotations

from turnlog.domain.progress import Decision, Verdict

PLANNED = {
    Decision.START: "to start",
    Decision.RESUME: "to resume",
    Decision.RERUN: "to re-run",
    Decision.INTERRUPT: "to interrupt",
    Decision.PROBE: "to probe",
    Decision.FAIL: "to fail",
    Decision.LEAVE_OWNER_ALIVE: "left to a live owner",
    Decision.LEAVE_FOR_OPERATOR: "waiting for an operator",
    Decision.LEAVE_FOR_APPROVAL: "awaiting approval",
    Decision.CANCEL: "to cancel",
}
DONE = PLANNED | {
    Decision.START: "started",
    Decision.RESUME: "resumed",
    Decision.RERUN: "re-run",
    Decision.INTERRUPT: "interrupted",
    Decision.PROBE: "probed",
    Decision.FAIL: "failed",
    Decision.CANCEL: "cancelled",
}


def summarize(verdicts: list[Verdict], done: bool = False) -> str:
    """One line such as '3 open turns: 1 to resume, 1 to re-run, 1 to interrupt'.

    Decisions are worded as plans ("to interrupt") unless ``done`` says they
    were carried out ("interrupted"): a check that has not acted yet must not
    read as if it had.
    """
    if not verdicts:
        return "0 open turns"
    words = DONE if done else PLANNED
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[words[v.decision]] = counts.get(words[v.decision], 0) + 1
    parts = ", ".join(f"{n} {w}" for w, n in counts.items())
    noun = "turn" if len(verdicts) == 1 else "turns"
    return f"{len(verdicts)} open {noun}: {parts}"
