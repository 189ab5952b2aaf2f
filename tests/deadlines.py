"""Deadlines that stretch with how slow this machine is right now.

A deadline in a test is a failure detector, not a performance figure: it
says "this has hung", and a busy machine must not trip it while turnlog is
correct. So every wait multiplies its base deadline by ``slowness()``:

- the factor measured once at the start of the run (``measure()``: how long
  starting a turnlog process takes here, against its CPU time) — the
  controller puts it in ``TURNLOG_TEST_SLOWNESS`` for its workers, and a user
  may set it by hand to stretch every deadline further;
- the current load: the 1- or 5-minute load average per CPU, the larger, read
  again at every check, so that a deadline also stretches when the load rises
  during a wait.

Both are at least 1: on an idle machine the base deadlines apply as written.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

ENV = "TURNLOG_TEST_SLOWNESS"
# CPU seconds that importing the command line takes, at most, on an idle 2-core
# machine; a start that takes longer in wall time than this waited for a CPU.
_IMPORT = "import turnlog.interface.cli, turnlog.interface.http"


def load() -> float:
    """Runnable processes per CPU over the last one or five minutes, the larger (at least 1).

    The one-minute average lags a rising load and the five-minute one a falling
    load; a wait that must not fail on a busy machine takes whichever is higher.
    """
    try:
        one, five, _ = os.getloadavg()
    except OSError:  # pragma: no cover - no load average on this platform
        return 1.0
    return max(1.0, one / (os.cpu_count() or 1), five / (os.cpu_count() or 1))


def measured() -> float:
    """The factor measured at the start of this run, or set by hand (at least 1)."""
    try:
        return max(1.0, float(os.environ.get(ENV, "1")))
    except ValueError:
        return 1.0


def slowness() -> float:
    """How many times longer than on an idle machine things take now."""
    return max(measured(), load())


def scaled(seconds: float) -> float:
    """``seconds`` stretched by the current slowness."""
    return seconds * slowness()


def fault_window(seconds: int) -> int:
    """How long a tool call that a test kills, stops or cancels mid-flight should last.

    ``seconds`` stretched like a wait, in whole seconds (tools take integers): on
    a busy machine the gap between the call's start and the fault grows too, and
    the fault must still land inside the call.
    """
    return max(seconds, round(scaled(seconds)))


def measure() -> tuple[float, str]:
    """Start a Python process that imports turnlog: wall time over CPU time.

    On an idle machine the two are about equal; a machine whose CPUs are
    taken makes the start wait, and the ratio says by how much. Returns the
    factor (at least 1) and a line saying what was measured.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", _IMPORT], check=True, timeout=600)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    factor = max(1.0, wall / max(cpu, 0.05))
    return factor, f"a turnlog import took {wall:.2f} s for {cpu:.2f} s of CPU"


def poll(
    check: Callable[[], T | None],
    deadline: float = 20.0,
    what: str = "condition",
    every: float = 0.05,
) -> T:
    """Call ``check`` until it returns something truthy; fail after ``deadline`` stretched.

    The stretch is read again at every check, so a wait that starts on a quiet
    machine still tolerates load arriving during it.
    """
    start = time.monotonic()
    while True:
        value = check()
        if value:
            return value
        waited = time.monotonic() - start
        limit = deadline * slowness()
        if waited > limit:
            raise AssertionError(
                f"{what} not reached within {waited:.0f}s"
                f" ({deadline:g}s stretched by {limit / deadline:.1f} for this machine's load)"
            )
        time.sleep(every)
