"""Start-up time of `turnlog serve` with a small and a large log, measured in one run.

    python tests/benchmarks/bench_serve_startup.py [--sessions 10000] [--repeat 3]

Start-up must not replay the log: a process reads sessions one by one on
demand, the worker starts from the open-turns read model, and projections
resume from their tracking positions. This seeds two namespaces (10
sessions, and ``--sessions`` sessions, each with one completed turn), lets
the projections catch up once, then starts `turnlog serve --role all`
``--repeat`` times on each and measures the time until /readyz answers 200
and until the first list answers. Reports medians and the large/small ratio;
exits 1 when the ratio exceeds ``--max-ratio``. Uses the test database (the
embedded server under .turnlog/test, or TURNLOG_TEST_DATABASE_URL).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tests.conftest import drop_namespace, turnlog_env  # noqa: E402
from tests.fault.cluster import free_port  # noqa: E402
from turnlog.application.settings import Settings  # noqa: E402
from turnlog.application.store import database  # noqa: E402
from turnlog.domain.session import Session  # noqa: E402
from turnlog.interface.bootstrap import build_runtime  # noqa: E402
from turnlog.projections import ProjectionSupervisor, ReadModels  # noqa: E402


def seed(settings: Settings, count: int) -> None:
    """``count`` sessions with one completed turn each, saved ten at a time."""
    runtime = build_runtime(settings)
    try:
        for start in range(0, count, 10):
            batch = [_session(i) for i in range(start, min(start + 10, count))]
            runtime.sessions.save(*batch)
        head = ReadModels(runtime.db, settings, sessions=runtime.sessions)
        with ProjectionSupervisor(settings, runtime.db, sessions=runtime.sessions):
            last = runtime.sessions.recorder.max_notification_id() or 0
            assert head.wait_for(last, 600), "projections did not catch up"
    finally:
        runtime.close()


def _session(index: int) -> Session:
    s = Session.start(title=f"bench {index}", tools=["echo"], model="fixture-1")
    turn, _ = s.submit_turn(f"message {index}")
    claim = s.claim_turn(turn.turn_id, "bench-worker")
    s.record_model_reply(turn.turn_id, claim, "done", [])
    s.complete_turn(turn.turn_id, claim, "done")
    return s


def start_once(settings: Settings) -> tuple[float, float]:
    """Seconds from spawn to /readyz 200, and to the first page of sessions."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnlog", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=turnlog_env(settings),
        cwd=ROOT,
    )
    try:
        ready = _until(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, proc)
        ready_at = time.monotonic() - began
        _until(lambda: httpx.get(f"{url}/v1/sessions?limit=1", timeout=5).status_code == 200, proc)
        listed_at = time.monotonic() - began
        assert ready
        return ready_at, listed_at
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _until(check: object, proc: subprocess.Popen[bytes], deadline: float = 120) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with {proc.returncode}")
        try:
            if check():  # type: ignore[operator]
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise SystemExit("serve was not ready in time")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-ratio", type=float, default=1.5)
    args = parser.parse_args()
    url = os.environ.get("TURNLOG_TEST_DATABASE_URL")
    db = database.locate(
        Settings(database_url=url) if url else Settings(data_dir=ROOT / ".turnlog" / "test")
    )
    results: dict[int, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for count in (10, args.sessions):
            namespace = f"bench_{uuid.uuid4().hex[:8]}"
            settings = Settings(
                database_url=db.conninfo, namespace=namespace, data_dir=Path(tmp) / namespace
            )
            try:
                began = time.monotonic()
                seed(settings, count)
                print(
                    f"{count:>6} sessions seeded and projected in {time.monotonic() - began:.1f}s"
                )
                results[count] = [start_once(settings) for _ in range(args.repeat)]
            finally:
                drop_namespace(db, namespace)
    small, large = (results[10], results[args.sessions])
    ready = [statistics.median(r[0] for r in rs) for rs in (small, large)]
    listed = [statistics.median(r[1] for r in rs) for rs in (small, large)]
    print(f"ready: {ready[0]:.2f}s with 10 sessions, {ready[1]:.2f}s with {args.sessions}")
    print(f"first list: {listed[0]:.2f}s with 10 sessions, {listed[1]:.2f}s with {args.sessions}")
    ratio = ready[1] / ready[0]
    print(f"ratio large/small (ready): {ratio:.2f} (limit {args.max_ratio})")
    return 0 if ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
