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


def test_what_a_pause_built_in_bulk_skips_young_collections_unless_start_up_froze() -> None:
    # Each in a process of its own, as above: N lists are built with the collector paused.
    # In bulk, they go to the oldest generation: the young one is left empty and the next
    # allocations start no collection; a few are left to it. A frozen start-up stays frozen.
    probe = (
        "import gc, sys;"
        "from turnlog.application.collector import collector_paused, freeze_start_up;"
        "freeze_start_up() if sys.argv[1] == 'frozen' else None; frozen = gc.get_freeze_count();"
        "runs = []; gc.callbacks.append(lambda phase, info: runs.append(phase));"
        "cm = collector_paused(); cm.__enter__(); kept = [[] for _ in range(int(sys.argv[2]))];"
        "cm.__exit__(None, None, None); young = gc.get_count()[0]; more = [[] for _ in range(10)];"
        "print(young > 0, bool(runs), gc.get_freeze_count() == frozen)"
    )

    def run(kind: str, built: int) -> list[str]:
        return subprocess.run(
            [sys.executable, "-c", probe, kind, str(built)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()

    assert run("plain", 100_000) == ["False", "False", "True"]
    assert run("plain", 100) == ["True", "False", "True"]
    assert run("frozen", 100_000)[1:] == ["True", "True"]  # collected at once
