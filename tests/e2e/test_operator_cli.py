"""What an operator reads on the command line is true and can be copied into the next command.

Real `turnlog` processes on a real PostgreSQL: the version, ids never cut,
`--json` on every listing, and `check` telling the truth whatever else runs.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_version_prints_the_installed_version() -> None:
    from turnlog import __version__

    done = subprocess.run(
        [sys.executable, "-m", "turnlog", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"turnlog {__version__}"
