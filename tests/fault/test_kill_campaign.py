"""The kill campaign, short: a dozen SIGKILLs of random processes under a mixed load.

``make chaos`` runs the long one (tests/fault/chaos.py, 200+ kills); this
one keeps the same invariants in every ``make test``: every role (API,
projection runner, worker) is killed at least once, at random moments, and
every round and the whole record are checked; clients cancel turns and
approve or reject proposed calls at random meanwhile, and each cancel and
decision acknowledged must be on record.

It has no fixed time budget: each wait grows with the slowest restart the
campaign has measured and with the machine's load (``Campaign.deadline``,
tests/deadlines.py), so a busy machine makes it slower, not red. The pytest
timeout is only a net for a hang, KILLS rounds of several minutes each.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import TEST_DATA
from tests.fault.campaign import Campaign
from tests.fault.cluster import cluster
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault

KILLS = 12
FIGURES = TEST_DATA / "kill-campaign.json"  # the last run's figures


@pytest.mark.timeout(KILLS * 300)
def test_random_kills_of_every_role_lose_nothing_repeat_no_side_effect_and_leave_the_record_whole(
    settings: Settings, database: Database
) -> None:
    with cluster(settings, database) as c:
        campaign = Campaign(c, pause=(0.05, 0.5), say=print)
        try:
            campaign.start()
            campaign.run(KILLS)
            figures = campaign.finish()
            failures = campaign.verify_with_cli()
        finally:
            campaign.close()
    print("\n".join(f"{k}: {v}" for k, v in figures.items()))
    # Kept for the record of a passing run too (RELIABILITY.md quotes it), beside the run's server.
    figures["kill to restored (s), in order"] = [
        round(k.restored_after or 0, 1) for k in campaign.kills
    ]
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2, default=str))
    assert figures["kills"] == KILLS
    assert all(figures["kills by role"].values()), figures["kills by role"]
    assert figures["lost"] == 0
    assert figures["duplicates"] == 0
    assert figures["invariant violations"] == 0, figures["round problems"]
    assert figures["turns not finished"] == 0
    assert figures["turns acknowledged"] > KILLS
    assert figures["operator actions not on record"] == 0
    asked = figures["cancels asked / acknowledged"][0]
    decided = sum(figures["calls approved / rejected (acknowledged)"])
    assert asked + decided > 0, "no cancel or approval was mixed in"
    assert failures == []
