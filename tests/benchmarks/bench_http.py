"""Figures 6 and 8: a real `turnlog serve` subprocess driven over HTTP.

Figure 6: submit a turn with ``?wait`` from 16 concurrent clients
(``http.client``), latency and turns/s, against the same turns through the
application API in one process (16 threads calling ``Runtime.send``, which takes the session's
lease and runs the turn, as the serve worker does). Figure 8: the serve
process's peak RSS after 10,000 turns against after 100.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit
from uuid import UUID

import httpx

from tests.benchmarks.bench_throughput import Config
from tests.benchmarks.bench_turns import TOOL_MESSAGE
from tests.benchmarks.suite import (
    Figure,
    Row,
    Stat,
    fmt,
    percentile,
    run_together,
    scratch_namespace,
)
from tests.fault.cluster import Process, free_port, poll
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.interface.bootstrap import build_runtime

CLIENTS = 16


class Serve:
    """One `turnlog serve` subprocess (all roles) on a free port."""

    def __init__(self, settings: Settings, *extra: str, **env: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = Process(
            settings, f"serve-{port}", "serve", "--port", str(port), "--role", "all", *extra, **env
        )
        poll(self._ready, 60, "serve ready")

    def _ready(self) -> bool:
        if self.process.proc.poll() is not None:
            raise RuntimeError(f"serve exited:\n{self.process.output()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def memory_kib(self) -> dict[str, int]:
        """VmHWM (peak RSS) and VmRSS of the serve process, in KiB."""
        out = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0])
        return out

    def stop(self) -> None:
        import signal

        self.process.signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except Exception:
            self.process.kill()


class HttpClient:
    """One client: a kept-alive connection and a session; a turn is one submit with ``?wait``.

    The standard library's ``http.client``, not httpx: the clients share the
    server's two cores, and httpx spent 1.6 ms of CPU per turn there against
    0.6 ms (interleaved runs at 16 clients), CPU the in-process baseline never
    pays. The requests and the checks of the answers are the same.
    """

    def __init__(self, url: str, session_id: str | None = None) -> None:
        """Creates a session unless given one (``session_id``)."""
        parts = urlsplit(url)
        self.http = http.client.HTTPConnection(
            parts.hostname or "127.0.0.1", parts.port, timeout=120
        )
        if session_id is not None:
            self.session_id = session_id
            return
        status, body = self._post("/v1/sessions", {"title": "bench", "tools": ["echo"]})
        if status != 201:
            raise RuntimeError(f"session not created: {status} {body}")
        self.session_id = body["session_id"]

    def _post(self, path: str, payload: dict[str, object]) -> tuple[int, dict[str, object]]:
        data = json.dumps(payload).encode()
        self.http.request("POST", path, data, {"content-type": "application/json"})
        response = self.http.getresponse()
        return response.status, json.loads(response.read())

    def turn(self, message: str = TOOL_MESSAGE) -> float:
        started = time.perf_counter()
        status, body = self._post(
            f"/v1/sessions/{self.session_id}/turns?wait=60", {"message": message}
        )
        elapsed = time.perf_counter() - started
        if status != 200 or body.get("state") != "completed":
            raise RuntimeError(f"turn not completed: {status} {body}")
        return elapsed

    def close(self) -> None:
        self.http.close()


def drive(turn_fns: list[Callable[[], float]], turns: int) -> tuple[list[float], float]:
    """Each function in its own thread, ``turns`` times, started together.

    Returns every latency (seconds) and the wall time from the start to the last finish.
    """
    latencies: list[list[float]] = [[] for _ in turn_fns]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(turn_fns) + 1)

    def run(index: int) -> None:
        barrier.wait()
        try:
            for _ in range(turns):
                latencies[index].append(turn_fns[index]())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(turn_fns))]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    return [x for xs in latencies for x in xs], wall


WARM_UP_TURNS = 2  # per client, all clients at once: see ``warm_up``


def warm_up(turn_fns: list[Callable[[], float]]) -> None:
    """Unmeasured turns from every client at once, as the measured ones will run.

    One turn per client, one after another, would leave the connection pools
    at one or two connections; the timed run would then open the rest (some
    35 in ``serve --split``'s three processes, each a new server process
    and its cold caches) inside the measurement. Both sides warm up alike.
    """
    drive(turn_fns, WARM_UP_TURNS)


def http_run(
    settings: Settings, clients: int, turns: int, *shape: str
) -> tuple[list[float], float]:
    """Turns through a fresh serve (``shape``: extra flags, e.g. ``--split``)."""
    serve = Serve(settings, "--concurrency", str(clients), *shape)
    try:
        pool = [HttpClient(serve.url) for _ in range(clients)]
        warm_up([c.turn for c in pool])  # connections, pools, session cache, worker
        result = drive([c.turn for c in pool], turns)
        for c in pool:
            c.close()
        return result
    finally:
        serve.stop()


def inprocess_run(settings: Settings, clients: int, turns: int) -> tuple[list[float], float]:
    runtime = build_runtime(settings)
    try:
        ids = [runtime.sessions.create_session(tools=["echo"]).session_id for _ in range(clients)]

        def turn_of(session_id: UUID) -> Callable[[], float]:
            def turn() -> float:
                started = time.perf_counter()
                sent = runtime.send(session_id, TOOL_MESSAGE)
                elapsed = time.perf_counter() - started
                if sent.turn.state != "completed":
                    raise RuntimeError(f"turn not completed: {sent.turn}")
                return elapsed

            return turn

        fns = [turn_of(s) for s in ids]
        warm_up(fns)
        return drive(fns, turns)
    finally:
        runtime.close()


# ------------------------------------------------------------------ figure 6


# Rounds of figure 6 at least: a round's runs take seconds, and this shared machine's
# speed moves by a third within minutes (the split shape's CPU per turn 12-20 ms).
ROUNDS = 5
SPLIT = ("--split",)  # the shape figure 6 measures: API here, worker and read models in children


def split_run(settings: Settings, clients: int, turns: int) -> tuple[list[float], float]:
    return http_run(settings, clients, turns, *SPLIT)


def figure_6(db: Database, cfg: Config) -> Figure:
    turns = cfg.pick(25, 8)
    solo_turns = cfg.pick(60, 20)
    runs: dict[str, Callable[[Settings, int, int], tuple[list[float], float]]] = {
        "http": split_run,
        "app": inprocess_run,
        "one": http_run,
    }
    p50: dict[str, list[float]] = {kind: [] for kind in runs}
    p99: dict[str, list[float]] = {kind: [] for kind in runs}
    rate: dict[str, list[float]] = {kind: [] for kind in runs}
    solo: dict[str, list[float]] = {"http": [], "app": [], "one": []}
    rounds = max(cfg.repeat, ROUNDS)
    with scratch_namespace(db) as settings:
        for round_ in range(rounds):
            # Every other round in the opposite order: a drift of the machine's
            # speed during the figure weighs on each kind alike.
            order = list(runs.items()) if round_ % 2 == 0 else list(runs.items())[::-1]
            for kind, run in order:
                latencies, wall = run(settings, CLIENTS, turns)
                ms = [x * 1000 for x in latencies]
                p50[kind].append(percentile(ms, 50))
                p99[kind].append(percentile(ms, 99))
                rate[kind].append(len(latencies) / wall)
        for _ in range(rounds):
            for kind in solo:
                latencies, _ = runs[kind](settings, 1, solo_turns)
                solo[kind].append(percentile([x * 1000 for x in latencies], 50))
    h50, a50 = Stat(p50["http"], "ms"), Stat(p50["app"], "ms")
    overhead = h50.median - a50.median
    hr, ar, one = (Stat(rate[kind], "turns/s") for kind in ("http", "app", "one"))
    throughput = hr.median / ar.median
    solo_overhead = Stat(solo["http"], "ms").median - Stat(solo["app"], "ms").median
    split_solo = Stat(solo["http"], "ms").median / Stat(solo["one"], "ms").median
    return Figure(
        6,
        f"HTTP submit turn + ?wait, {CLIENTS} concurrent clients",
        [
            Row(
                "6a",
                f"latency p50, {CLIENTS} clients",
                h50,
                a50,
                h50.median / a50.median,
                "overhead ≤ 25 ms",
                overhead <= 25,
                ratio_label=f"{overhead:+,.1f} ms",
            ),
            Row(
                "6b",
                f"latency p99, {CLIENTS} clients",
                Stat(p99["http"], "ms"),
                Stat(p99["app"], "ms"),
                Stat(p99["http"], "ms").median / Stat(p99["app"], "ms").median,
                "—",
                None,
            ),
            Row(
                "6c", f"turns/s, {CLIENTS} clients", hr, ar, throughput, "≥ 0.9x", throughput >= 0.9
            ),
            Row(
                "6d",
                "latency p50, 1 client (uncontended)",
                Stat(solo["http"], "ms"),
                Stat(solo["app"], "ms"),
                None,
                "overhead ≤ 5 ms",
                solo_overhead <= 5,
                ratio_label=f"{solo_overhead:+,.1f} ms",
            ),
            Row(
                "6e",
                f"turns/s, {CLIENTS} clients, serve in one process (no --split)",
                one,
                ar,
                one.median / ar.median,
                "—",
                None,
            ),
            Row(
                "6f",
                "latency p50, 1 client: --split against serve in one process",
                Stat(solo["http"], "ms"),
                Stat(solo["one"], "ms"),
                split_solo,
                "≤ 1.0x",
                split_solo <= 1.0,
            ),
        ],
        how=(
            f"HTTP: a fresh `turnlog serve --role all --split --concurrency {CLIENTS}`"
            " subprocess per run (the API in it; the worker and the read models in its two"
            f" child processes); {CLIENTS} client threads (one kept-alive `http.client`"
            f" connection and one session each), {WARM_UP_TURNS} unmeasured turns each with"
            " all clients at once (the connection pools reach their working size before the"
            f" clock starts; the baseline warms up the same way), then {turns} turns"
            " each, all started together:"
            " `POST /v1/sessions/{id}/turns?wait=60` with the figure-1 message, timed until"
            " the 200 with the completed turn. Baseline: the same turns through the"
            f" application API in one process: {CLIENTS} threads sharing one runtime, each"
            " calling `Runtime.send` (takes the session's lease, submits, runs the turn) on"
            " its own session; it keeps no read models. turns/s = all turns / wall time. Row"
            f" 6d: the same with one client, sequential ({solo_turns} turns), the uncontended"
            " cost of the HTTP path. Row 6e: the HTTP run without `--split`, every role in one"
            " process, which runs one thread of Python at a time; row 6f: one client's"
            " latency with `--split` against that. Runs alternate,"
            f" {rounds} rounds, every other round in the opposite order. The clients"
            " run in the benchmark process on the same two cores (about 0.6 ms of CPU per"
            " turn)."
        ),
        details={
            "turns_per_client": turns,
            "solo_turns": solo_turns,
            "rounds": rounds,
            # Each round's http and app runs are seconds apart: their ratio
            # shows how far the machine's drift moves the figure.
            "turns_per_s_ratio_by_round": [
                round(h / a, 3) for h, a in zip(rate["http"], rate["app"], strict=True)
            ],
        },
    )


# ------------------------------------------------------------------ figure 8


def rss_run(
    settings: Settings, total: int, per_session: int, **env: str
) -> dict[int, dict[str, int]]:
    """Peak RSS of one serve process (defaults) at checkpoints while it runs ``total`` turns."""
    checkpoints = sorted({100, total // 4, total // 2, total})
    serve = Serve(settings, **env)
    readings: dict[int, dict[str, int]] = {0: serve.memory_kib()}
    lock = threading.Lock()
    done = [0]

    def client() -> None:
        http: HttpClient | None = None
        while True:
            with lock:
                if done[0] >= total:
                    break
                done[0] += 1
                n = done[0]
            if http is None or n % per_session == 0:
                if http is not None:
                    http.close()
                http = HttpClient(serve.url)
            http.turn()
            if n in checkpoints:
                readings[n] = serve.memory_kib()
        if http is not None:
            http.close()

    try:
        run_together([client] * CLIENTS)
        readings[total] = serve.memory_kib()
        return readings
    finally:
        serve.stop()


def figure_8(db: Database, cfg: Config) -> Figure:
    total = cfg.pick(10_000, 1_000)
    per_session = 25
    runs: list[dict[int, dict[str, int]]] = []
    started = time.monotonic()
    with scratch_namespace(db) as settings:
        # One run: 10,000 turns through serve take minutes; RSS is a growth check whose
        # readings barely vary between runs, unlike timings.
        runs.append(rss_run(settings, total, per_session))
    seconds = time.monotonic() - started
    quarter = total // 4
    big = Stat([r[total]["VmHWM"] / 1024 for r in runs], "MiB")
    small = Stat([r[quarter]["VmHWM"] / 1024 for r in runs], "MiB")
    ratio = big.median / small.median
    curve = {n: round(v["VmHWM"] / 1024, 1) for n, v in sorted(runs[-1].items())}
    return Figure(
        8,
        f"peak RSS of serve after {total:,} turns",
        [
            Row(
                "8",
                f"serve VmHWM after {total:,} turns (vs after the first quarter, {quarter:,})",
                big,
                small,
                ratio,
                "≤ 1.2x",
                ratio <= 1.2,
            )
        ],
        how=(
            "One `turnlog serve --role all` with default settings (worker concurrency 4,"
            f" session cache 1,000); {CLIENTS} HTTP clients submit turns with `?wait` (the"
            f" figure-1 message), each starting a new session every {per_session} turns, until"
            f" {total:,} turns are done. VmHWM (peak RSS) is read from /proc/<pid>/status of"
            f" the serve process after the first quarter ({quarter:,} turns, the baseline) and"
            " at the end: flat means the last three quarters added no peak. Both readings"
            f" come from the same process. Peak RSS in MiB by turns done: {curve}."
            f" {len(runs)} run(s) of {fmt(seconds / max(len(runs), 1))} s: this figure is a"
            " growth check, not a timing, and one 10,000-turn run costs minutes."
        ),
        details={"runs": runs, "turns_per_session": per_session},
    )
