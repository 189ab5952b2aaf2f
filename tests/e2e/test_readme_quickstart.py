"""The README's quickstart, run as it is written, so that it cannot drift.

The code blocks of the README's "Quickstart" section are read from the
README itself: ``turnlog serve`` is started from its line (on a free port,
against the test database), the client script runs with the server's URL,
the server is SIGKILLed and started again when the script asks, and what the
script prints must be what its comments say. Then the interrupted call: the
shell lines run one by one (``sleep … && kill -9 $!`` becomes a wait for the
call's start, then the SIGKILL), with the exit codes the comments name.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from uuid import UUID

import httpx
import pytest

from tests.conftest import ROOT, raw_events, turnlog_env
from tests.deadlines import poll, scaled
from tests.e2e.test_serve import wait_ready
from tests.fault.cluster import free_port
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

pytestmark = pytest.mark.timeout(300)

README_URL = "http://127.0.0.1:8000"


def quickstart() -> tuple[list[str], str, list[str]]:
    """(the install and serve block's lines, the Python script, the restart and interrupt lines)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(sh|python)\n(.*?)```", section, re.S)
    kinds = [kind for kind, _ in blocks]
    assert kinds == ["sh", "python", "sh", "sh"], f"the quickstart's blocks changed: {kinds}"
    install, script, restart, interrupt = (body for _, body in blocks)
    return install.splitlines(), script, restart.splitlines() + interrupt.splitlines()


def command(line: str) -> list[str]:
    """A documented ``turnlog …`` line as the arguments of this checkout's turnlog."""
    words = shlex.split(re.sub(r"\s&\s*(#.*)?$", "", line), comments=True)
    assert words[0] == "turnlog", line
    return [sys.executable, "-m", "turnlog", *words[1:]]


def expected_prints(script: str) -> list[str]:
    """What each ``print(…)  # text`` line of the script says it prints."""
    return re.findall(r"^\s*print\(.*\)\s+# (.+)$", script, re.M)


class Output:
    """A child's stdout, read on a thread, so the test can wait for a line."""

    def __init__(self, stream: IO[str]) -> None:
        self.text = ""
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        while chunk := stream.read(1):
            self.text += chunk


def serve(line: str, settings: Settings, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``turnlog serve`` as the README's line says, on ``port``, once it is ready."""
    assert line.split("#")[0].split() == ["turnlog", "serve"], line
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*command(line), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=turnlog_env(settings),
            cwd=ROOT,
        )
    processes.append(proc)
    wait_ready(proc, f"http://127.0.0.1:{port}", log)
    return proc


processes: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _stop_what_the_test_started() -> Iterator[None]:
    yield
    while processes:
        proc = processes.pop()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=scaled(30))


def run(line: str, settings: Settings, **names: str) -> subprocess.CompletedProcess[str]:
    for name, value in names.items():
        line = line.replace(f'"${name}"', value).replace(f" {name} ", f" {value} ")
    return subprocess.run(
        command(line),
        capture_output=True,
        text=True,
        env=turnlog_env(settings),
        cwd=ROOT,
        timeout=scaled(60),
    )


def test_the_readme_quickstart_runs_as_written(
    settings: Settings, database: Database, namespace: str, tmp_path: Path
) -> None:
    install, script, rest = quickstart()
    assert "pip install '.[embedded]'" in "\n".join(install)
    [serve_line] = [line for line in install if line.startswith("turnlog serve")]
    port, log = free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    assert README_URL in script
    path = tmp_path / "quickstart.py"
    path.write_text(script.replace(README_URL, url))

    server = serve(serve_line, settings, port, log)
    client = subprocess.Popen(
        [sys.executable, "-u", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert client.stdout is not None and client.stdin is not None and client.stderr is not None
    out = Output(client.stdout)
    try:
        poll(lambda: "press Enter" in out.text or client.poll() is not None, 60, "the prompt")
        assert client.poll() is None, client.stderr.read()

        # "Kill the server (kill -9), start `turnlog serve` again": as the README's block says.
        kill, again = rest[0], rest[1]
        assert kill.startswith("kill -9 ") and again.startswith("turnlog serve"), rest[:2]
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=scaled(30))
        serve(again, settings, port, log)
        client.stdin.write("\n")
        client.stdin.flush()
        assert client.wait(timeout=scaled(60)) == 0, client.stderr.read()
        before, after = poll(lambda: "TurnCompleted" in out.text and out.text, 10).split(
            "press Enter: ", 1
        )
        said = [before.splitlines()[0], *after.splitlines()]
        assert said[:2] == expected_prints(script), out.text
        types = [line.split()[1] for line in said[2:] if line.strip()]
        assert types.count("TurnSubmitted") == types.count("TurnCompleted") == 2, out.text
    finally:
        if client.poll() is None:
            client.kill()

    interrupted(rest[2:], settings, database, namespace, url)


def interrupted(
    lines: list[str], settings: Settings, database: Database, namespace: str, url: str
) -> None:
    """The interrupted call: each shell line run, with the outcome its comment names."""
    lines = [line for line in lines if line.strip()]
    new, send, kill, refused, check, abandon, accepted = lines
    made = re.fullmatch(r"SID=\$\((turnlog sessions new .*)\)", new)
    assert made, new
    created = run(made.group(1), settings)
    assert created.returncode == 0, created.stderr
    sid = created.stdout.strip()

    assert send.rstrip().endswith("&") and "append_file" in send, send
    background = subprocess.Popen(
        command(send.replace('"$SID"', sid)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=turnlog_env(settings),
        cwd=ROOT,
    )
    try:
        # `sleep N && kill -9 $!`: the kill must land inside the call, so wait for its start.
        assert re.match(r"sleep \d+ && kill -9 \$!", kill), kill
        poll(
            lambda: any(
                "ToolCallStarted" in e[3] for e in raw_events(database, namespace, UUID(sid))
            ),
            60,
            "the append_file call's start",
        )
        background.send_signal(signal.SIGKILL)
        background.wait(timeout=scaled(30))
    finally:
        if background.poll() is None:
            background.kill()

    assert "exit 3" in refused
    done = run(refused, settings, SID=sid)
    assert done.returncode == 3, (done.stdout, done.stderr)

    def state() -> str:
        body = httpx.get(f"{url}/v1/sessions/{sid}", timeout=10).json()
        return str((body.get("open_turn") or {}).get("state", ""))

    poll(lambda: state() == "interrupted", 60, "the turn interrupted")
    turn = httpx.get(f"{url}/v1/sessions/{sid}", timeout=10).json()["open_turn"]["turn_id"]
    listed = run(check, settings)
    assert turn in listed.stdout, listed.stdout

    assert " TURN " in abandon
    done = run(abandon, settings, SID=sid, TURN=turn)
    assert done.returncode == 0, done.stderr
    assert "accepted" in accepted
    done = run(accepted, settings, SID=sid)
    assert done.returncode == 0, done.stderr
