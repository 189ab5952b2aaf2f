"""Profile the turnlog side of a figure with py-spy (sampling; every thread and process).

    python tests/benchmarks/profiling.py FIGURE [--out DIR] [--top 25]

Runs only turnlog's workload of the figure (no baseline) under ``py-spy
record`` and prints where the time goes: per function, the share of samples
in which it is on the stack (inclusive) and at the top of the stack (self),
with the line seen most often. Raw stacks go to ``DIR/figN.txt`` (default
.turnlog/profiles) for flamegraph tools.

- 1, 3: the benchmark process, wall-clock (idle samples included, so time
  spent waiting for PostgreSQL shows as the waiting call).
- 2: the 8 writer processes, wall-clock.
- 6, 8: the `turnlog serve` process under 16 HTTP clients, only samples of
  the thread holding the GIL (the process is CPU-bound: this is where its
  one core goes).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PY_SPY = Path(sys.executable).with_name("py-spy")
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]+)(?::(?P<line>\d+))?\)$")


# ---------------------------------------------------------------- workloads


def workload(figure: int) -> None:
    """The turnlog side of ``figure``, in this process (run under py-spy)."""
    from tests.benchmarks import bench_turns
    from tests.benchmarks.suite import bench_database, drop_schema, new_namespace
    from turnlog.application.settings import schema_name

    db = bench_database()
    namespace = new_namespace("prof")
    try:
        if figure == 1:
            rate = 150 / bench_turns.turnlog_turns(db.conninfo, namespace, 150)
            print(f"figure 1 workload: {rate:.1f} turns/s")
        elif figure == 2:
            rate = bench_turns.concurrent_rate("turnlog", db, namespace, 8, 150)
            print(f"figure 2 workload: {rate:.1f} turns/s")
        elif figure == 3:
            _load_workload(db)
        else:
            raise SystemExit(f"figure {figure}: run profiling.py {figure} without --workload")
    finally:
        drop_schema(db, schema_name(namespace))


def _load_workload(db: object) -> None:
    from tests.benchmarks import bench_load
    from tests.benchmarks.suite import Stat, scratch_namespace

    with scratch_namespace(db) as settings:  # type: ignore[arg-type]
        from turnlog.application.sessions import Sessions
        from turnlog.application.store import database
        from turnlog.interface.bootstrap import open_sessions

        live = open_sessions(settings, db)  # type: ignore[arg-type]
        bulk = Sessions(
            env=database.library_env(db, settings, create_table=False),  # type: ignore[arg-type]
            snapshot_interval=10**9,
        )
        big = bench_load.seed_session(bulk, live, 5000)
        live.close()
        bulk.close()
        load = bench_load.Loader(db, settings)  # type: ignore[arg-type]
        print("profile-start", flush=True)
        times = Stat([load(big) for _ in range(10)], "ms")
        print(f"figure 3 workload: {times.show()}")


def serve_profile(figure: int, out: Path, seconds: float) -> Path:
    """Start serve, drive it with 16 clients, and record its GIL holder for ``seconds``."""
    from tests.benchmarks.bench_http import CLIENTS, HttpClient, Serve
    from tests.benchmarks.suite import bench_database, scratch_namespace

    db = bench_database()
    raw = out / f"fig{figure}.txt"
    with scratch_namespace(db, "prof") as settings:
        extra = ("--concurrency", str(CLIENTS)) if figure == 6 else ()
        serve = Serve(settings, *extra)
        stop = threading.Event()
        done = [0]

        def client() -> None:
            http = HttpClient(serve.url)
            while not stop.is_set():
                http.turn()
                done[0] += 1
                if figure == 8 and done[0] % 25 == 0:
                    http.close()
                    http = HttpClient(serve.url)
            http.close()

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        try:
            for t in threads:
                t.start()
            time.sleep(3)  # warm up
            before = done[0]
            subprocess.run(
                [
                    str(PY_SPY),
                    "record",
                    "--pid",
                    str(serve.process.pid),
                    "--gil",
                    "-r",
                    "200",
                    "-d",
                    str(int(seconds)),
                    "--format",
                    "raw",
                    "-o",
                    str(raw),
                ],
                check=True,
                capture_output=True,
            )
            print(f"{(done[0] - before) / seconds:.1f} turns/s while recording")
        finally:
            stop.set()
            for t in threads:
                t.join()
            serve.stop()
    return raw


def _profile_after_seeding(raw: Path) -> Path:
    """Figure 3: seed without recording, then record the loads only."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "3", "--workload"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("profile-start"):
            break
    record = [str(PY_SPY), "record", "--idle", "-r", "200", "--format", "raw", "-o", str(raw)]
    subprocess.run([*record, "--pid", str(proc.pid)], check=True, capture_output=True)
    print(proc.stdout.read())
    proc.wait()
    return raw


# ---------------------------------------------------------------- summary


FOCUS = {1: "run_turn", 2: "turnlog_turns", 3: "Loader.__call__"}


def summarize(raw: Path, top: int, focus: str = "") -> str:
    """Inclusive and self shares per function, from py-spy's raw (collapsed) stacks.

    With ``focus``, only stacks through that function count (idle pool threads
    are left out of wall-clock profiles).
    """
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    lines: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    total = 0
    for row in raw.read_text().splitlines():
        stack, _, count_text = row.rpartition(" ")
        if not stack:
            continue
        if focus and f"{focus} (" not in stack:
            continue
        count = int(count_text)
        total += count
        seen = set()
        frames = stack.split(";")
        for i, frame in enumerate(frames):
            m = FRAME.match(frame.strip())
            if not m:
                continue
            key = f"{_short(m['file'])}:{m['func']}"
            if m["line"]:
                lines[key][m["line"]] += count
            if key not in seen:
                inclusive[key] += count
                seen.add(key)
            if i == len(frames) - 1:
                own[key] += count
    out = [f"{total} samples from {raw}" + (f" through {focus}" if focus else "")]
    out += ["", "inclusive (on the stack):"]
    out += [_line(k, n, total, lines) for k, n in inclusive.most_common(top)]
    out += ["", "self (top of the stack):"]
    out += [_line(k, n, total, lines) for k, n in own.most_common(top)]
    return "\n".join(out)


def _line(key: str, n: int, total: int, lines: dict[str, collections.Counter[str]]) -> str:
    where = lines[key].most_common(1)
    file, _, func = key.partition(":")
    at = f"{file}:{where[0][0]}" if where else file
    return f"  {100 * n / total:5.1f}%  {func}  ({at})"


def _short(path: str) -> str:
    for marker in ("site-packages/", "/work/main/", str(ROOT) + "/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figure", type=int, choices=(1, 2, 3, 6, 8))
    parser.add_argument("--out", type=Path, default=ROOT / ".turnlog" / "profiles")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workload:
        workload(args.figure)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.figure in (6, 8):
        raw = serve_profile(args.figure, args.out, args.seconds)
    elif args.figure == 3:
        raw = _profile_after_seeding(args.out / "fig3.txt")
    else:
        raw = args.out / f"fig{args.figure}.txt"
        command = [str(PY_SPY), "record", "--idle", "-r", "200", "--format", "raw"]
        command += ["--subprocesses"] if args.figure == 2 else []
        command += ["-o", str(raw), "--", sys.executable, __file__, str(args.figure), "--workload"]
        subprocess.run(command, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    print(summarize(raw, args.top, FOCUS.get(args.figure, "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
