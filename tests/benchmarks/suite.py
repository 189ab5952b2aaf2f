"""What every figure of the benchmark suite shares: results, statistics and the report.

A figure measures turnlog and its baseline in the same run, several times,
interleaved (turnlog, baseline, turnlog, baseline, …) so that both see the
same machine noise, and reports the median with min and max of each. The
verdict compares medians (``ratio`` is turnlog's median over the baseline's).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from turnlog.application.settings import Settings  # noqa: E402
from turnlog.application.store.database import Database, locate  # noqa: E402


@dataclass
class Stat:
    """Samples of one quantity: median, min and max, in ``unit``."""

    samples: list[float]
    unit: str

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    def show(self) -> str:
        if not self.samples:
            return "—"
        if len(self.samples) == 1:
            return f"{fmt(self.median)} {self.unit}"
        return f"{fmt(self.median)} {self.unit} ({fmt(self.low)}-{fmt(self.high)})"

    def as_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "median": self.median if self.samples else None,
            "min": self.low if self.samples else None,
            "max": self.high if self.samples else None,
            "samples": self.samples,
        }


@dataclass
class Row:
    """One line of the table: a figure (or one part of it) with its verdict."""

    number: str
    figure: str
    turnlog: Stat
    baseline: Stat | None
    ratio: float | None
    target: str
    passed: bool | None
    ratio_label: str = ""  # how ratio is shown, when not "N.NNx"

    def as_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "figure": self.figure,
            "turnlog": self.turnlog.as_json(),
            "baseline": self.baseline.as_json() if self.baseline else None,
            "ratio": self.ratio,
            "ratio_label": self.ratio_label or None,
            "target": self.target,
            "passed": self.passed,
        }


@dataclass
class Figure:
    """A figure's rows, how it was measured, and any further numbers worth keeping."""

    number: int
    title: str
    rows: list[Row]
    how: str
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""

    @property
    def passed(self) -> bool | None:
        if self.error:
            return False
        verdicts = [r.passed for r in self.rows if r.passed is not None]
        return all(verdicts) if verdicts else None


def fmt(value: float) -> str:
    """Three significant figures, thousands separated."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, 2 - magnitude)
    return f"{value:,.{decimals}f}"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio_of(a: Stat, b: Stat) -> float:
    return a.median / b.median if b.median else float("inf")


def interleave(
    repeat: int, first: Callable[[], float], second: Callable[[], float]
) -> tuple[list[float], list[float]]:
    """Run ``first`` and ``second`` alternately ``repeat`` times each (ABAB…)."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeat):
        a.append(first())
        b.append(second())
    return a, b


# ----------------------------------------------------------------- database


def run_together(targets: Sequence[Callable[[], None]]) -> None:
    """Each target in a thread of its own, all started, all joined; then the first error raised.

    A target that fails does not stop the others: every thread ends before this returns.
    """
    errors: list[BaseException] = []

    def run(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(target,)) for target in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def bench_database() -> Database:
    """The server the suite measures on: the test/database URL, or an embedded one."""
    url = os.environ.get("TURNLOG_TEST_DATABASE_URL") or os.environ.get("TURNLOG_DATABASE_URL")
    if url:
        return locate(Settings(database_url=url))
    return locate(Settings(data_dir=ROOT / ".turnlog" / "bench"))


def new_namespace(prefix: str = "bench") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def bench_settings(db: Database, namespace: str, data_dir: Path, **extra: Any) -> Settings:
    """Default settings (snapshot interval, pools, cache) for one namespace of the suite."""
    return Settings(database_url=db.conninfo, namespace=namespace, data_dir=data_dir, **extra)


def drop_schema(db: Database, schema: str) -> None:
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def scratch_namespace(db: Database, prefix: str = "bench") -> Iterator[Settings]:
    """Settings for a fresh namespace and data directory, dropped afterwards."""
    namespace = new_namespace(prefix)
    with tempfile.TemporaryDirectory(prefix="turnlog-bench-") as tmp:
        settings = bench_settings(db, namespace, Path(tmp))
        try:
            yield settings
        finally:
            drop_schema(db, settings.schema_name)


def server_facts(db: Database) -> dict[str, Any]:
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        facts = {}
        for name in ("server_version", "synchronous_commit", "fsync", "shared_buffers"):
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            facts[name] = row[0] if row else "?"
    facts["server"] = db.describe()
    return facts


def machine_facts() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "commit": _git_commit(),
    }


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except OSError:
        return "?"


# ------------------------------------------------------------------- report


def write_report(
    figures: Sequence[Figure], out_dir: Path, meta: dict[str, Any]
) -> tuple[Path, Path]:
    """BENCHMARKS.md and benchmarks.json in ``out_dir``."""
    md = out_dir / "BENCHMARKS.md"
    js = out_dir / "benchmarks.json"
    md.write_text(markdown(figures, meta))
    js.write_text(
        json.dumps(
            {
                "meta": meta,
                "figures": [
                    {**{k: v for k, v in asdict(f).items() if k != "rows"}, "passed": f.passed}
                    | {"rows": [r.as_json() for r in f.rows]}
                    for f in figures
                ],
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    return md, js


def table(figures: Sequence[Figure]) -> str:
    lines = [
        "| # | figure | turnlog | baseline | ratio | target | pass/fail |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        if f.error and not f.rows:
            lines.append(f"| {f.number} | {f.title} | error: {f.error[:80]} | | | | **FAIL** |")
            continue
        for r in f.rows:
            ratio = r.ratio_label or (f"{fmt(r.ratio)}x" if r.ratio is not None else "—")
            verdict = {True: "pass", False: "**FAIL**", None: "—"}[r.passed]
            baseline = r.baseline.show() if r.baseline else "—"
            lines.append(
                f"| {r.number} | {r.figure} | {r.turnlog.show()} | {baseline} | {ratio}"
                f" | {r.target} | {verdict} |"
            )
    return "\n".join(lines)


def markdown(figures: Sequence[Figure], meta: dict[str, Any]) -> str:
    machine = meta["machine"]
    server = meta["database"]
    mode = "quick (smaller variant)" if meta.get("quick") else "full"
    head = [
        "# turnlog benchmarks",
        "",
        "Generated by `make bench` (`python tests/benchmarks/run.py`); do not edit by hand.",
        "",
        f"- Run: {meta['started']} — {mode}, {fmt(meta['seconds'])} s in all,"
        f" commit {machine['commit']}, repeats per figure: {meta['repeat']}.",
        f"- Machine: {machine['cpus']} CPUs ({machine['cpu'] or 'unknown'}),"
        f" Python {machine['python']}.",
        f"- Database: {server['server']}, PostgreSQL {server['server_version']},"
        f" synchronous_commit={server['synchronous_commit']}, fsync={server['fsync']}.",
        "- Each cell: median (min-max) over the repeats; turnlog and baseline runs"
        " alternate; ratio = turnlog median / baseline median.",
        "",
        table(figures),
        "",
        "## How to reproduce",
        "",
        "`make bench` runs every figure (not part of `make test`; 10 to 15 minutes on 2 cores)"
        " against the embedded PostgreSQL under `.turnlog/bench` (or"
        " `TURNLOG_TEST_DATABASE_URL` / `TURNLOG_DATABASE_URL`), each figure in a fresh"
        " namespace, and rewrites this file and `benchmarks.json`. Every timing is measured"
        " against a baseline in the same run, at least three times, turnlog and baseline"
        " alternating; counts (figures 9 and 12) and the memory check (figure 8) are taken"
        " once. `make bench-quick` is a smaller smoke run (report in `.turnlog/bench-quick`);"
        " `python tests/benchmarks/run.py --only 1 3` runs some figures;"
        " `python -m tests.benchmarks.roundtrips [--http]` prints figure 12's counts, client"
        " round trips included; `make profile FIG=N` shows where turnlog's time goes in"
        " figure N (py-spy). Other work on the machine moves every timing: each figure"
        " shows the load average before and after it.",
        "",
        "## How each figure is measured",
        "",
    ]
    for f in figures:
        load = f.details.get("load_average_1min")
        shown = f", load average {load[0]:.1f} → {load[1]:.1f}" if load else ""
        head.append(f"**{f.number}. {f.title}** ({fmt(f.seconds)} s{shown}). {f.how}")
        if f.error:
            head.append(f"\n*Error:* `{f.error}`")
        head.append("")
    return "\n".join(head)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


class Clock:
    """Seconds since construction."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.started
