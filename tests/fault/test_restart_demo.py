"""`turnlog demo restart` runs end to end and its receipt records every step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import turnlog
from turnlog.application.settings import Settings

pytestmark = pytest.mark.fault

EXPECTED_STEPS = [
    "start server",
    "create session",
    "store codeword",
    "SIGKILL server",
    "start replacement",
    "discover session",
    "recall codeword",
    "side-effecting call in flight",
    "SIGKILL server mid-call",
    "start replacement",
    "turn interrupted",
    "new turn refused",
    "inspect",
    "abandon",
    "new turn accepted",
    "written at most once",
    "stop server",
    "start server with probes on",
    "side-effecting call in flight, probes on",
    "log's inserts held",
    "line written, its result not recorded",
    "SIGKILL server mid-call, probes on",
    "start replacement with probes on",
    "turn continued by itself",
    "probe on record",
    "written exactly once",
]


def test_the_restart_demo_exits_zero_with_a_receipt_of_every_step(
    settings: Settings, tmp_path: Path
) -> None:
    receipt_path = tmp_path / "receipt.json"
    done = turnlog(
        settings, "demo", "restart", "--receipt", str(receipt_path), "--word", "quartz", timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    receipt = json.loads(receipt_path.read_text())
    assert receipt["ok"] is True
    assert [s["name"] for s in receipt["steps"]] == EXPECTED_STEPS
    assert all(s["ok"] for s in receipt["steps"])
    recall = next(s for s in receipt["steps"] if s["name"] == "recall codeword")
    assert "quartz" in recall["data"]["reply"]
    pids = [s["data"]["pid"] for s in receipt["steps"] if s["name"].startswith("start")]
    assert len(set(pids)) == 5  # five distinct server processes

    # The first boundary, probes off: the turn interrupted, at most one write.
    steps = {s["name"]: s for s in receipt["steps"]}
    assert steps["written at most once"]["data"]["lines"] <= 1

    # The second, probes on: killed after the write, before its result was
    # recorded; the replacement asked the probe and the turn went on by itself.
    killed = steps["SIGKILL server mid-call, probes on"]["data"]
    assert killed["results_recorded"] == 0
    assert steps["turn continued by itself"]["data"]["state"] == "completed"
    probe = steps["probe on record"]["data"]
    assert probe["answers"] == ["applied"]
    assert probe["outcome"] == "succeeded"
    assert probe["actor"] == "probe:append_file"
    assert probe["result"] == {"path": "probed.txt", "bytes": len("written exactly once\n")}
    assert probe["evidence"]  # what the probe saw is on record
    assert steps["turn continued by itself"]["data"]["reply"].startswith(
        "Tool append_file returned:"
    )
    assert steps["written exactly once"]["data"]["lines"] == 1
    written = settings.sandbox_root.glob("*/probed.txt")
    assert [f.read_text() for f in written] == ["written exactly once\n"]
