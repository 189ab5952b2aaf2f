"""Opening files and directories inside a sandbox without ever following a link.

A sandbox is a directory other processes can change while a tool works in it:
every command or shell tool of every session runs as this process's user, and
sandboxes are siblings. A path checked first and opened later (``resolve()``,
then ``open()``) can therefore be turned into an escape in between, by
replacing one of its directories with a symbolic link. So a sandbox path is
never opened by name from the root of the file system: the sandbox root is
opened once, then every component is opened relative to its parent's
descriptor (``openat``) with ``O_NOFOLLOW`` — a link anywhere fails the open
(``ELOOP``/``ENOTDIR``) instead of being followed. Directories are opened with
``O_DIRECTORY``.

A file is opened only if it is a regular file with one link. Its name is
looked at first (``lstat`` relative to its directory) and the open is
non-blocking (``O_NONBLOCK``), so a named pipe or a device in a file's place
is refused at once instead of blocking the open until some other process
comes; the open descriptor is then checked again (``fstat``), since the name
may change in between. A hard link is a second name of a file that may live
outside the sandbox, and ``O_NOFOLLOW`` does not see it: a file with more
than one link is refused, for writing and for reading.

Paths are bounded (length and depth), so no input can make the walk deep or
slow, and errors name the path as given, never the host's absolute path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

MAX_PATH_CHARS = 1024
MAX_PATH_DEPTH = 32
MAX_NAME_BYTES = 255  # NAME_MAX on Linux and macOS

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _FILE_FLAGS
_READ_FLAGS = os.O_RDONLY | _FILE_FLAGS


class SandboxPathError(ValueError):
    """A path that does not name a place inside the sandbox, or cannot be opened safely."""


def path_parts(relative: str) -> list[str]:
    """The components of ``relative``, refusing anything that is not a plain path inside.

    Refused: empty, absolute, NUL, ``..`` or ``.`` components, more than
    MAX_PATH_CHARS characters or MAX_PATH_DEPTH components, a component over
    MAX_NAME_BYTES bytes.
    """
    if not relative or "\x00" in relative or relative.startswith("/"):
        raise SandboxPathError("path must be a non-empty relative path inside the sandbox")
    if len(relative) > MAX_PATH_CHARS:
        raise SandboxPathError(f"path is longer than {MAX_PATH_CHARS} characters")
    parts = [p for p in PurePosixPath(relative).parts if p != "."]
    if any(p == ".." for p in relative.split("/")):
        raise SandboxPathError(f"path {_short(relative)} escapes the session's sandbox")
    if not parts:
        raise SandboxPathError("path must name a file inside the sandbox")
    if len(parts) > MAX_PATH_DEPTH:
        raise SandboxPathError(f"path has more than {MAX_PATH_DEPTH} components")
    if any(len(p.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for p in parts):
        raise SandboxPathError(f"a component of the path is longer than {MAX_NAME_BYTES} bytes")
    return parts


@contextlib.contextmanager
def sandbox_dir(sandbox: Path, create: bool = True) -> Iterator[int]:
    """A descriptor of the sandbox directory itself, opened without following a link.

    The sandbox root (its parent, made by this process under the data
    directory) is trusted; the sandbox is one name under it, and a link in its
    place is refused.
    """
    root = os.open(sandbox.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _open_dir(root, sandbox.name, create, sandbox.name)
    finally:
        os.close(root)
    try:
        yield fd
    finally:
        os.close(fd)


def ensure_sandbox(sandbox: Path) -> None:
    """Create the sandbox directory (and its trusted root) if missing; refuse a link there."""
    sandbox.parent.mkdir(parents=True, exist_ok=True)
    with sandbox_dir(sandbox, create=True):
        pass


def append_line(sandbox: Path, relative: str, line: str) -> str:
    """Append ``line`` to the file ``relative`` inside ``sandbox``, creating directories.

    Returns the path as stored (components joined by ``/``).
    """
    parts = path_parts(relative)
    data = line.encode("utf-8")
    with sandbox_dir(sandbox) as top:
        with _walk(top, parts[:-1], relative) as parent:
            fd = _open_file(parts[-1], _APPEND_FLAGS, parent, relative, mode=0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    return "/".join(parts)


def file_state(sandbox: Path, relative: str) -> dict[str, int] | None:
    """The size, inode and device of the file ``relative`` in ``sandbox``; None when absent.

    Read-only: no directory is created, no link followed (a probe's view of a file).
    """
    fd = _open_existing(sandbox, relative)
    if fd is None:
        return None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return {"size": info.st_size, "inode": info.st_ino, "device": info.st_dev}


def read_at(sandbox: Path, relative: str, offset: int, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of the file ``relative`` from ``offset``; None when it is absent."""
    fd = _open_existing(sandbox, relative)
    if fd is None:
        return None
    try:
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


def _open_existing(sandbox: Path, relative: str) -> int | None:
    """A read descriptor of an existing regular file in the sandbox, or None when it is absent."""
    parts = path_parts(relative)
    if not os.path.lexists(sandbox):
        return None  # no sandbox yet: nothing was ever written in it
    try:
        with sandbox_dir(sandbox, create=False) as top:
            current = os.dup(top)
            try:
                for name in parts[:-1]:
                    following = os.open(name, _DIR_FLAGS, dir_fd=current)
                    os.close(current)
                    current = following
                return _open_file(parts[-1], _READ_FLAGS, current, relative)
            finally:
                os.close(current)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SandboxPathError(_explain(exc, relative)) from None


def _open_file(name: str, flags: int, parent: int, relative: str, mode: int = 0o644) -> int:
    """Open ``name`` below ``parent`` only if it is (or is created as) a plain file.

    Looked at by name first, so that a pipe or device is never opened at all;
    then checked by descriptor, in case the name changed in between. Raises
    FileNotFoundError (without ``O_CREAT``) when it is absent.
    """
    try:
        before = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    except OSError as exc:
        raise SandboxPathError(_explain(exc, relative)) from None
    else:
        _check_file(before, relative)
    try:
        fd = os.open(name, flags, mode, dir_fd=parent)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
        raise SandboxPathError(_explain(_errno_error(errno.ENOENT), relative)) from None
    except OSError as exc:
        raise SandboxPathError(_explain(exc, relative)) from None
    try:
        _check_file(os.fstat(fd), relative)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_file(info: os.stat_result, relative: str) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise SandboxPathError(_explain(_errno_error(errno.ELOOP), relative))
    if stat.S_ISDIR(info.st_mode):
        raise SandboxPathError(_explain(_errno_error(errno.EISDIR), relative))
    if not stat.S_ISREG(info.st_mode):
        raise SandboxPathError(f"path {_short(relative)} is not a regular file")
    if info.st_nlink > 1:
        raise SandboxPathError(
            f"path {_short(relative)} has more than one link (a hard link may lead out of"
            " the sandbox)"
        )


def _errno_error(number: int) -> OSError:
    return OSError(number, os.strerror(number))


@contextlib.contextmanager
def _walk(top: int, directories: list[str], relative: str) -> Iterator[int]:
    """Open (creating) each directory below ``top`` in turn; yield the last one's descriptor."""
    current = os.dup(top)
    try:
        for name in directories:
            following = _open_dir(current, name, True, relative)
            os.close(current)
            current = following
        yield current
    finally:
        os.close(current)


def _open_dir(parent: int, name: str, create: bool, relative: str) -> int:
    if create:
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            pass  # made earlier, or by someone else: the open below checks what it is
        except OSError as exc:
            raise SandboxPathError(_explain(exc, relative)) from None
    return _open(name, _DIR_FLAGS, parent, relative)


def _open(name: str, flags: int, parent: int, relative: str, mode: int = 0o777) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=parent)
    except OSError as exc:
        raise SandboxPathError(_explain(exc, relative)) from None


def _explain(exc: OSError, relative: str) -> str:
    """What went wrong, naming the path as given (never the host's absolute path)."""
    where = _short(relative)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return f"path {where} escapes the session's sandbox (a symbolic link or not a directory)"
    if exc.errno in (errno.ENXIO, errno.EAGAIN):  # a pipe with no reader, a busy device
        return f"path {where} is not a regular file"
    if exc.errno == errno.EISDIR:
        return f"path {where} names a directory, not a file"
    return f"path {where} cannot be opened in the sandbox: {os.strerror(exc.errno or 0)}"


def _short(relative: str, limit: int = 120) -> str:
    text = repr(relative)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def descriptor_path(fd: int, fallback: Path) -> Path:
    """A path that names the directory open as ``fd`` itself, whatever links change meanwhile.

    ``/proc/self/fd/N`` is resolved by the kernel to the open directory, in
    the process that uses it (a child chdirs before it closes inherited
    descriptors). Without /proc, the path by name is all there is.
    """
    proc = Path(f"/proc/self/fd/{fd}")
    return proc if proc.is_dir() else fallback
