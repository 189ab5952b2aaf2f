"""The kill campaign, short: ~20 SIGKILLs of random processes under a mixed load.

``make chaos`` runs the long one (tests/fault/chaos.py, 200+ kills); this
one keeps the same invariants in every ``make test``.
"""

from __future__ import annotations

import pytest

from tests.fault.campaign import Campaign
from tests.fault.cluster import cluster
from turnlog.application.database import Database
from turnlog.application.settings import Settings

pytestmark = pytest.mark.fault

KILLS = 20


@pytest.mark.timeout(240)
def test_twenty_random_kills_lose_nothing_repeat_no_side_effect_and_leave_the_record_whole(
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
    assert figures["kills"] == KILLS
    assert figures["lost"] == 0
    assert figures["duplicates"] == 0
    assert figures["invariant violations"] == 0, figures["round problems"]
    assert figures["turns not finished"] == 0
    assert figures["turns acknowledged"] > KILLS
    assert failures == []
