"""All-or-nothing file writes: every writer of the framework goes through here.

The bytes go to a temporary file beside the destination, are flushed and fsynced, and the
file is renamed over the destination (and the rename made durable): a crash or a SIGKILL at
any moment leaves either the old file or the new one, never a half-written one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def _read_umask() -> int:
    # Setting and restoring the umask changes it for every thread for a moment: read it once,
    # at import, before the framework starts any thread.
    umask = os.umask(0)
    os.umask(umask)
    return umask


_UMASK = _read_umask()


def default_permissions(path: str | os.PathLike, *, directory: bool = False) -> None:
    """Give a file or folder made by ``tempfile`` (0600/0700) the permissions the umask gives."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_UMASK)


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make a rename inside ``directory`` durable (a no-op where folders cannot be opened)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


@contextmanager
def atomic_write(
    path: str | os.PathLike, *, mode: str = "wb", suffix: str = ".tmp"
) -> Iterator[IO]:
    """Open a temporary file for writing; on success it replaces ``path`` atomically.

    Args:
        path: the destination; its folder is created when missing.
        mode: ``"wb"``, or ``"w"`` for UTF-8 text with ``\\n`` line ends.
        suffix: of the temporary file's name (``.{name}.XXXX{suffix}`` beside ``path``).

    On an exception inside the block the temporary file is removed and ``path`` is untouched.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write opens files for writing only, not mode {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary_name = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=suffix, dir=path.parent
    )
    try:
        text = {"encoding": "utf-8", "newline": "\n"} if mode == "w" else {}
        with os.fdopen(descriptor, mode, **text) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        default_permissions(temporary_name)
        os.replace(temporary_name, path)
    except BaseException:
        Path(temporary_name).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` atomically."""
    with atomic_write(path, mode="w") as handle:
        handle.write(text)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_write(path) as handle:
        handle.write(data)
