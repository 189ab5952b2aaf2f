"""What probes answer: real probe processes and real files; bad answers are never success."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from turnlog.application.errors import ConfigurationError
from turnlog.application.tools.command import CommandProber, load_tools_file
from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.probes import AppendFileProber, run_probe
from turnlog.application.tools.sandbox_files import append_line
from turnlog.domain.turns import ProbeAnswer


def context(tmp_path: Path) -> ToolContext:
    sandbox = tmp_path / "sandboxes" / "s1"
    sandbox.mkdir(parents=True, exist_ok=True)
    return ToolContext("s1", "c1", 1, sandbox)


def answering(tmp_path: Path, script: str, timeout: float = 10) -> Any:
    # A file (braces in an argv template are placeholders), in the sandbox: the one
    # directory of the host the probe's process sees besides the system's.
    path = context(tmp_path).sandbox / "probe.py"
    path.write_text(script)
    prober = CommandProber((sys.executable, str(path)), timeout)
    return run_probe(prober, {"order": "o-1"}, context(tmp_path), {"seen": 1})[0]


def test_an_applied_answer_carries_its_result_and_the_probe_sees_key_and_pre_state(
    tmp_path: Path,
) -> None:
    script = (
        "import json, os; print('checking'); print(json.dumps({'answer': 'applied', 'result':"
        " {'key': os.environ['TURNLOG_IDEMPOTENCY_KEY'], 'pre':"
        " json.loads(os.environ['TURNLOG_PROBE_PRE_STATE']), 'args':"
        " json.loads(os.environ['TURNLOG_TOOL_ARGUMENTS'])}}))"
    )
    report = answering(tmp_path, script)
    assert report.answer is ProbeAnswer.APPLIED
    assert report.result["pre"] == {"seen": 1} and report.result["args"] == {"order": "o-1"}
    assert report.result["key"] == context(tmp_path / "x").idempotency_key


@pytest.mark.parametrize(
    ("script", "note"),
    [
        ("print('no idea what you mean')", "the probe printed no JSON answer"),
        ('import sys; print(\'{"answer": "applied"}\'); sys.exit(3)', "exited with code 3"),
        ('print(\'{"answer": "applied"}\')', "applied without a result"),
        ('print(\'{"answer": "probably"}\')', "no known answer"),
        ("print('[1, 2]')", "the probe printed no JSON answer"),
    ],
)
def test_garbage_an_unknown_exit_code_or_applied_without_result_is_unknown_with_the_output(
    tmp_path: Path, script: str, note: str
) -> None:
    report = answering(tmp_path, script)
    assert report.answer is ProbeAnswer.UNKNOWN
    assert note in report.note
    assert report.result is None
    assert "stdout" in report.evidence  # what it printed, kept (truncated)


def test_what_a_probe_printed_is_kept_truncated(tmp_path: Path) -> None:
    report = answering(tmp_path, "print('x' * 100000)")
    assert report.answer is ProbeAnswer.UNKNOWN
    assert len(report.evidence["stdout"]) <= 1000


def test_a_probe_over_its_timeout_is_killed_and_unknown(tmp_path: Path) -> None:
    report = answering(tmp_path, "import time; time.sleep(60)", timeout=0.5)
    assert report.answer is ProbeAnswer.UNKNOWN
    assert report.note == "the probe timed out after 0.5s"


def test_not_applied_and_unknown_answers_keep_their_note_and_evidence(tmp_path: Path) -> None:
    script = 'print(\'{"answer": "unknown", "note": "API down", "evidence": {"s": 503}}\')'
    report = answering(tmp_path, script)
    assert (report.answer, report.note, report.evidence) == (
        ProbeAnswer.UNKNOWN,
        "API down",
        {"s": 503},
    )
    report = answering(tmp_path, 'print(\'{"answer": "not_applied"}\')')
    assert report.answer is ProbeAnswer.NOT_APPLIED


def append_probe(ctx: ToolContext, text: str = "hello") -> tuple[dict[str, Any], Any]:
    prober = AppendFileProber()
    pre = prober.prepare({"path": "d/out.txt", "text": text}, ctx)
    return pre, lambda: run_probe(prober, {"path": "d/out.txt", "text": text}, ctx, pre)[0]


def test_append_file_probe_reads_the_bytes_after_the_recorded_size(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    append_line(ctx.sandbox, "d/out.txt", "before\n")
    pre, ask = append_probe(ctx)
    assert pre["exists"] and pre["size"] == 7 and pre["inode"]
    assert ask().answer is ProbeAnswer.NOT_APPLIED
    append_line(ctx.sandbox, "d/out.txt", "hello\n")
    report = ask()
    assert report.answer is ProbeAnswer.APPLIED
    assert report.result == {"path": "d/out.txt", "bytes": 6}
    append_line(ctx.sandbox, "d/out.txt", "someone else\n")
    assert ask().answer is ProbeAnswer.UNKNOWN


def test_append_file_probe_on_a_file_that_did_not_exist(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    pre, ask = append_probe(ctx)
    assert pre == {"path": "d/out.txt", "exists": False, "size": 0}
    assert ask().answer is ProbeAnswer.NOT_APPLIED
    append_line(ctx.sandbox, "d/out.txt", "hello\n")
    assert ask().answer is ProbeAnswer.APPLIED


def test_append_file_probe_sees_another_file_in_its_place(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    append_line(ctx.sandbox, "d/out.txt", "before\n")
    _, ask = append_probe(ctx)
    target = ctx.sandbox / "d" / "out.txt"
    target.rename(target.with_name("kept"))  # kept: its inode cannot be reused
    target.write_text("before\n")  # same size, another inode
    report = ask()
    assert report.answer is ProbeAnswer.UNKNOWN and "inode" in report.note
    target.unlink()
    assert ask().answer is ProbeAnswer.UNKNOWN  # recorded present, now gone


def test_a_tools_file_declares_a_probe_and_refuses_a_bad_one(tmp_path: Path) -> None:
    def load(**extra: Any) -> Any:
        path = tmp_path / "tools.json"
        entry = {"name": "t", "description": "d", "command": ["true"], **extra}
        path.write_text(json.dumps({"tools": [entry]}))
        return load_tools_file(path, 1000)

    (tool,) = load(probe=["check"], probe_timeout_seconds=2, rerun_when_not_applied=True)
    assert tool.prober == CommandProber(("check",), 2.0, True)
    for bad in (
        {"probe": []},
        {"probe": ["{missing}"]},
        {"probe": ["x"], "probe_timeout_seconds": 0},
        {"probe": ["x"], "rerun_when_not_applied": "yes"},
        {"rerun_when_not_applied": True},
    ):
        with pytest.raises(ConfigurationError):
            load(**bad)
