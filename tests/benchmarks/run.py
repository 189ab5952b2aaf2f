"""The benchmark suite: every figure against its baseline, measured in one run.

    python tests/benchmarks/run.py [--quick] [--only 1 3 6] [--repeat N] [--out DIR]

Uses the embedded PostgreSQL under .turnlog/bench (or TURNLOG_TEST_DATABASE_URL /
TURNLOG_DATABASE_URL), a fresh namespace per figure, dropped afterwards. Writes
BENCHMARKS.md (the table and how each figure is measured) and benchmarks.json
to ``--out`` (the repository root by default). Exits 1 when a figure misses its
target or fails. ``--quick`` runs smaller sizes (a smoke test of the suite,
not figures to quote).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks import (  # noqa: E402
    bench_http,
    bench_load,
    bench_logs,
    bench_long_sessions,
    bench_mcp,
    bench_sandbox,
    bench_search,
    bench_throughput,
    bench_waits,
    bench_wal,
    roundtrips,
)
from tests.benchmarks.bench_throughput import Config  # noqa: E402
from tests.benchmarks.suite import (  # noqa: E402
    Clock,
    Figure,
    bench_database,
    machine_facts,
    now_iso,
    server_facts,
    table,
    write_report,
)
from turnlog.application.store.database import Database  # noqa: E402

FigureFn = Callable[[Database, Config], Figure]

FIGURES: dict[int, tuple[str, FigureFn]] = {
    1: ("turns/s, one session", bench_throughput.figure_1),
    2: ("turns/s, 8 sessions", bench_throughput.figure_2),
    3: ("load a 5,000-turn session", bench_load.figure_3),
    4: ("start-up with 10,000 sessions", bench_logs.figure_4),
    5: ("projection rebuild", bench_logs.figure_5),
    6: ("HTTP submit + wait", bench_http.figure_6),
    7: ("live projection lag", bench_throughput.figure_7),
    8: ("peak RSS of serve", bench_http.figure_8),
    9: ("stored bytes per turn", bench_long_sessions.figure_9),
    10: ("GET /v1/sessions/{id}, long vs short", bench_long_sessions.figure_10),
    11: ("a writer among 600 waiters", bench_waits.figure_11),
    12: ("commits and transactions per HTTP turn", roundtrips.figure_12),
    13: ("a trivial command call, sandboxed vs unconfined", bench_sandbox.figure_13),
    14: ("an MCP call after the first", bench_mcp.figure_14),
    15: ("search 100,000 sessions", bench_search.figure_15),
    16: ("WAL per turn, late in a session vs early", bench_wal.figure_16),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--only", type=int, nargs="*", choices=sorted(FIGURES), default=None)
    parser.add_argument("--repeat", type=int, default=None, help="repeats per figure (min 3)")
    parser.add_argument(
        "--out",
        type=Path,
        help="where the report goes (default: the repository root;"
        " .turnlog/bench-quick with --quick)",
    )
    args = parser.parse_args(argv)
    args.out = args.out or (ROOT / ".turnlog" / "bench-quick" if args.quick else ROOT)
    repeat = max(3, args.repeat or 3)
    cfg = Config(quick=args.quick, repeat=repeat)
    clock = Clock()
    db = bench_database()
    meta = {
        "started": now_iso(),
        "quick": args.quick,
        "repeat": repeat,
        "machine": machine_facts(),
        "database": server_facts(db),
    }
    print(f"benchmarks on {db.describe()} ({'quick' if args.quick else 'full'} run)", flush=True)
    figures = []
    for number in args.only or sorted(FIGURES):
        name, run = FIGURES[number]
        print(f"[{clock():6.0f}s] figure {number}: {name} …", flush=True)
        started = time.monotonic()
        load_before = os.getloadavg()[0]
        try:
            figure = run(db, cfg)
        except Exception as exc:
            traceback.print_exc()
            figure = Figure(number, name, [], how="", error=f"{type(exc).__name__}: {exc}")
        figure.seconds = time.monotonic() - started
        # Other work on the machine moves every timing: keep what the load was.
        figure.details["load_average_1min"] = [load_before, os.getloadavg()[0]]
        figures.append(figure)
        print(table([figure]).split("\n", 2)[2], flush=True)
    meta["seconds"] = clock()
    args.out.mkdir(parents=True, exist_ok=True)
    md, js = write_report(figures, args.out, meta)
    print(f"\n{table(figures)}\n\nwrote {md} and {js} in {clock():.0f}s")
    return 0 if all(f.passed is not False for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
