"""A long-running process collects garbage less often, and never rescans what start-up made."""

from __future__ import annotations

import subprocess
import sys

from turnlog.interface.bootstrap import LONG_RUNNING_GC


def test_a_long_running_process_freezes_its_start_up_and_collects_in_larger_batches() -> None:
    # In a process of its own: the test runner's collector is left as it is.
    probe = (
        "import gc; from turnlog.interface.bootstrap import tune_collector;"
        "before = gc.get_freeze_count(); tune_collector();"
        "print(gc.get_threshold(), gc.get_freeze_count() > before)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()

    assert " ".join(out[:-1]) == str(LONG_RUNNING_GC) and out[-1] == "True"
    assert LONG_RUNNING_GC[0] > 700  # the default's young generation
