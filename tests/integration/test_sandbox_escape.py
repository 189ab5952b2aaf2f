"""No tool writes, runs or removes anything outside its sandbox, even when links appear meanwhile.

Sandboxes are siblings and every command tool runs as the server's user, so
any session's shell (or a local process) can replace a directory of another
sandbox with a symbolic link while a tool is between its check and its
write. These tests make that swap for real and look at the file system.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.deadlines import scaled
from turnlog.application.runtime import Runtime
from turnlog.application.tools.builtin import builtin_tools
from turnlog.application.tools.command import shell_tool
from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.port import ToolError, ToolRegistry
from turnlog.application.tools.sandbox_files import SandboxPathError, file_state, read_at
from turnlog.application.tools.sandboxes import Sandboxes, _size

registry = ToolRegistry(builtin_tools())


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A sandbox under its root, and a directory outside that no tool may touch."""
    sandbox = tmp_path / "sandboxes" / "ns" / "s1"
    sandbox.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    return sandbox, outside


def _context(sandbox: Path, stop: threading.Event | None = None) -> ToolContext:
    if stop is None:
        return ToolContext(session_id="s1", call_id="c1", attempt=1, sandbox=sandbox)
    return ToolContext(session_id="s1", call_id="c1", attempt=1, sandbox=sandbox, stop=stop)


_stop_for_next_call: threading.Event | None = None


def _append(sandbox: Path, arguments: dict[str, Any]) -> Any:
    tool = registry.get("append_file")
    assert tool is not None
    return tool.run(arguments, _context(sandbox, _stop_for_next_call))


class _SwappingStop(threading.Event):
    """The call's stop event: append_file waits its delay on it, so the swap happens there."""

    def __init__(self, swap: Any, delays: list[float]) -> None:
        super().__init__()
        self._swap = swap
        self._delays = delays

    def wait(self, timeout: float | None = None) -> bool:
        self._delays.append(timeout or 0.0)
        self._swap()
        return super().wait(timeout)


def _swap_during_delay(monkeypatch: pytest.MonkeyPatch, swap: Any) -> list[float]:
    """Make the swap happen inside append_file's delay (after its check), then really wait."""
    delays: list[float] = []
    monkeypatch.setattr(sys.modules[__name__], "_stop_for_next_call", _SwappingStop(swap, delays))
    return delays


def test_a_directory_swapped_for_a_link_during_the_delay_is_not_followed(
    layout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox, outside = layout
    (sandbox / "notes").mkdir()

    def swap() -> None:
        shutil.rmtree(sandbox / "notes")
        (sandbox / "notes").symlink_to(outside)

    delays = _swap_during_delay(monkeypatch, swap)
    with pytest.raises(ToolError, match="escapes the session's sandbox"):
        _append(sandbox, {"path": "notes/a.txt", "text": "x", "delay_seconds": 0.05})

    assert delays == [0.05]  # the swap happened after the check, during the delay
    assert list(outside.iterdir()) == []


def test_the_sandbox_itself_swapped_for_a_link_during_the_delay_is_not_followed(
    layout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox, outside = layout

    def swap() -> None:
        sandbox.rmdir()
        sandbox.symlink_to(outside)

    _swap_during_delay(monkeypatch, swap)
    with pytest.raises(ToolError, match="escapes the session's sandbox"):
        _append(sandbox, {"path": "a.txt", "text": "x", "delay_seconds": 0.01})

    assert list(outside.iterdir()) == []


def test_a_file_swapped_for_a_link_during_the_delay_is_not_written_through(
    layout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox, outside = layout
    (outside / "target.txt").write_text("")

    def swap() -> None:
        (sandbox / "a.txt").symlink_to(outside / "target.txt")

    _swap_during_delay(monkeypatch, swap)
    with pytest.raises(ToolError, match="escapes the session's sandbox"):
        _append(sandbox, {"path": "a.txt", "text": "x", "delay_seconds": 0.01})

    assert (outside / "target.txt").read_text() == ""


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/".join(["d"] * 2000), "longer than 1024 characters"),  # 4 KB, 2,000 directories
        ("/".join(["d"] * 40), "more than 32 components"),
        ("n" * 300, "longer than 255 bytes"),
    ],
)
def test_a_path_too_long_or_too_deep_is_a_clear_tool_error(
    path: str, message: str, layout: tuple[Path, Path]
) -> None:
    sandbox, _ = layout

    with pytest.raises(ToolError, match=message) as refused:
        _append(sandbox, {"path": path, "text": "x"})

    assert str(sandbox.parent) not in str(refused.value)
    assert list(sandbox.iterdir()) == []


def test_a_nested_path_is_created_and_written_inside(layout: tuple[Path, Path]) -> None:
    sandbox, _ = layout
    deep = "/".join(f"d{i}" for i in range(31)) + "/f.txt"

    result = _append(sandbox, {"path": deep, "text": "x"})

    assert result == {"path": deep, "bytes": 2}
    assert (sandbox / deep).read_text() == "x\n"


def test_a_command_tool_does_not_enter_a_sandbox_swapped_for_a_link(
    layout: tuple[Path, Path],
) -> None:
    sandbox, outside = layout
    sandbox.rmdir()
    sandbox.symlink_to(outside)
    shell = shell_tool(timeout=5, output_limit=1024)

    with pytest.raises(ToolError, match="sandbox cannot be entered"):
        shell.run({"command": "echo x > written.txt"}, _context(sandbox))

    assert list(outside.iterdir()) == []


def test_a_command_tool_runs_in_the_sandbox_it_opened(layout: tuple[Path, Path]) -> None:
    sandbox, _ = layout
    shell = shell_tool(timeout=5, output_limit=1024)

    result = shell.run({"command": "pwd -P; echo x > here.txt"}, _context(sandbox))

    assert result["stdout"].strip() == str(sandbox.resolve())
    assert (sandbox / "here.txt").read_text() == "x\n"


def test_gc_never_removes_or_measures_through_a_sandbox_swapped_for_a_link(
    runtime: Runtime, tmp_path: Path
) -> None:
    root = runtime.settings.sandbox_root
    closed = runtime.sessions.create_session().session_id
    runtime.send(closed, '/tool append_file {"path": "a.txt", "text": "x"}')
    runtime.sessions.close_session(closed, "finished", "ops")
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    sandboxes = Sandboxes(runtime.sessions, root)
    [listed] = sandboxes.scan()  # the sandbox is a directory now …
    shutil.rmtree(root / str(closed))
    os.symlink(outside, root / str(closed))  # … and a link when gc gets to it

    assert _size(root / str(closed)) == 0  # not the 4 bytes outside
    [action] = sandboxes._collect(listed, dry_run=False)

    assert action.action == "left" and "not removed safely" in action.reason
    assert (outside / "keep.txt").read_text() == "keep"
    assert (root / str(closed)).is_symlink()


def _bounded(action: Any, seconds: float = 5.0) -> Any:
    """Run ``action`` on a thread and fail (instead of hanging the run) if it blocks."""
    done: list[Any] = []

    def target() -> None:
        try:
            done.append(("returned", action()))
        except BaseException as exc:
            done.append(("raised", exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(scaled(seconds))
    assert done, f"blocked for more than {scaled(seconds):.0f}s"
    return done[0]


def test_a_hard_link_to_a_file_outside_is_not_written_through(layout: tuple[Path, Path]) -> None:
    sandbox, outside = layout
    (outside / "target.txt").write_text("kept\n")
    os.link(outside / "target.txt", sandbox / "a.txt")  # O_NOFOLLOW does not see this

    with pytest.raises(ToolError, match="more than one link"):
        _append(sandbox, {"path": "a.txt", "text": "x"})

    assert (outside / "target.txt").read_text() == "kept\n"


def test_a_probe_does_not_read_through_a_hard_link(layout: tuple[Path, Path]) -> None:
    sandbox, outside = layout
    (outside / "secret.txt").write_text("secret\n")
    os.link(outside / "secret.txt", sandbox / "a.txt")

    with pytest.raises(SandboxPathError, match="more than one link"):
        read_at(sandbox, "a.txt", 0, 100)
    with pytest.raises(SandboxPathError, match="more than one link"):
        file_state(sandbox, "a.txt")


def test_a_fifo_in_the_files_place_is_refused_at_once(layout: tuple[Path, Path]) -> None:
    sandbox, _ = layout
    os.mkfifo(sandbox / "a.txt")  # an open for writing blocks until a reader comes

    kind, value = _bounded(lambda: _append(sandbox, {"path": "a.txt", "text": "x"}))

    assert kind == "raised" and isinstance(value, ToolError), value
    assert "not a regular file" in str(value)


def test_a_fifo_with_a_reader_is_refused_and_nothing_is_written(layout: tuple[Path, Path]) -> None:
    sandbox, _ = layout
    os.mkfifo(sandbox / "a.txt")
    reader = os.open(sandbox / "a.txt", os.O_RDONLY | os.O_NONBLOCK)
    try:
        kind, value = _bounded(lambda: _append(sandbox, {"path": "a.txt", "text": "x"}))
        assert kind == "raised" and "not a regular file" in str(value), value
        assert os.read(reader, 10) == b""  # nothing was written into the pipe
    finally:
        os.close(reader)


def test_a_probe_does_not_block_on_a_fifo(layout: tuple[Path, Path]) -> None:
    sandbox, _ = layout
    os.mkfifo(sandbox / "a.txt")  # an open for reading blocks until a writer comes
    for read in (lambda: file_state(sandbox, "a.txt"), lambda: read_at(sandbox, "a.txt", 0, 9)):
        kind, value = _bounded(read)
        assert kind == "raised" and isinstance(value, SandboxPathError), value
        assert "not a regular file" in str(value)
