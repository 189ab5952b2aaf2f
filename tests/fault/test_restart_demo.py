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
    assert len(set(pids)) == 3  # three distinct server processes
