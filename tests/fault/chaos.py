"""The kill campaign, long: ``make chaos`` (or ``python tests/fault/chaos.py --kills 200``).

Starts an API, a projection runner and two workers as separate processes in a
fresh namespace (on ``TURNLOG_TEST_DATABASE_URL``, or the embedded test
server), drives a mixed load from six clients, SIGKILLs a random process at a
random moment ``--kills`` times (restarting it each time) and checks every
round and the whole record at the end (tests/fault/campaign.py and
record.py); then ``turnlog audit ID --verify`` for every session and
``turnlog projections verify``. Prints one line per kill and the figures,
writes them to ``.turnlog/chaos.json``, and exits 1 on any violation.

``--probes`` runs every process with outcome probes on (``TURNLOG_PROBES=1``)
and aims one worker kill in three after an ``append_file`` wrote its line
(tests/fault/campaign.py); the figures (``.turnlog/chaos-probes.json``) add
the probes' answers by kind. It also exits 1 when a turn was interrupted
without an ``unknown`` probe answer for a probed tool's call, or when no
probe ran at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.conftest import drop_namespace  # noqa: E402
from tests.fault.campaign import Campaign  # noqa: E402
from tests.fault.cluster import Cluster  # noqa: E402
from turnlog.application.settings import Settings  # noqa: E402
from turnlog.application.store.database import locate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--probes", action="store_true", help="every process with outcome probes on"
    )
    args = parser.parse_args()
    name = "chaos-probes.json" if args.probes else "chaos.json"
    out: Path = args.json or ROOT / ".turnlog" / name
    url = os.environ.get("TURNLOG_TEST_DATABASE_URL")
    base = Settings(database_url=url) if url else Settings(data_dir=ROOT / ".turnlog" / "test")
    database = locate(base)
    settings = Settings(
        database_url=database.conninfo,
        namespace=f"chaos_{uuid.uuid4().hex[:8]}",
        data_dir=Path(tempfile.mkdtemp(prefix="turnlog-chaos-")),
        snapshot_interval=50,
        probes=args.probes,
    )
    print(
        f"namespace {settings.namespace} on {database.describe()}; logs in {settings.data_dir};"
        f" probes {'on' if args.probes else 'off'}",
        flush=True,
    )
    c = Cluster(settings, database)
    say = lambda line: print(line, flush=True)  # noqa: E731
    campaign = Campaign(c, seed=args.seed, say=say, probes=args.probes)
    started = time.monotonic()
    try:
        campaign.start()
        campaign.run(args.kills)
        figures = campaign.finish()
        failures = campaign.verify_with_cli()
    finally:
        campaign.close()
        c.stop_all()
        drop_namespace(database, settings.namespace)
    figures["sessions verified (audit --verify, projections verify)"] = failures or "all passed"
    figures["elapsed (s)"] = round(time.monotonic() - started, 1)
    figures["load average at the end (1, 5, 15 min)"] = tuple(round(x, 1) for x in os.getloadavg())
    print("\n| figure | value |\n|---|---|")
    for key, value in figures.items():
        print(f"| {key} | {value} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2, default=str))
    ok = (
        not failures
        and figures["lost"] == 0
        and figures["duplicates"] == 0
        and figures["invariant violations"] == 0
        and figures["turns not finished"] == 0
    )
    if args.probes:
        ok = (
            ok
            and figures["interrupted without an unknown probe answer"] == 0
            and sum(figures["probe answers on record (applied / not_applied / unknown)"]) > 0
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
