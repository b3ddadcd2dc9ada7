"""SHA-256 and line counts of data files: checking downloads, keying the cache on the corpora's
content, checking corpora before a run."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seq2seq.atomic import write_text
from seq2seq.data.text_files import DataError

logger = logging.getLogger(__name__)


def sha256_file(path: Path) -> str:
    """Computes the hex SHA-256 of a file's bytes (as stored, not decompressed).

    Raises:
        DataError: If the file is missing or unreadable.
    """
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as file:
            while block := file.read(1 << 20):
                digest.update(block)
    except FileNotFoundError:
        raise DataError(f"file not found: {path}") from None
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from None
    return digest.hexdigest()


class FileHashCache:
    """SHA-256 (and line counts) of data files, remembered by (path, size, mtime, inode) in a
    small json file.

    Hashing a multi-gigabyte corpus takes seconds; a stat call does not, which keeps a cached
    run fast. A file rewritten in place gets a new mtime (and usually size), hence a new hash.
    """

    def __init__(self, *, path: Path) -> None:
        self._path = path
        self._changed = False
        try:
            self._entries: dict[str, dict[str, Any]] = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            # Only a memo: a missing or damaged one means hashing everything once more.
            self._entries = {}

    def digest(self, file: Path) -> str:
        """Returns the file's SHA-256, hashing it only when its identity changed."""
        return str(self._remembered(file, "sha256", sha256_file))

    def line_count(self, file: Path, *, count: Callable[[Path], int]) -> int:
        """Returns the file's line count, counting (with ``count``) only when its identity
        changed."""
        return int(self._remembered(file, "lines", count))

    def _remembered(self, file: Path, fact: str, compute: Callable[[Path], Any]) -> Any:
        try:
            status = file.stat()
        except FileNotFoundError:
            raise DataError(f"file not found: {file}") from None
        key = str(file.resolve())
        identity = [status.st_size, status.st_mtime_ns, status.st_ino]
        entry = self._entries.get(key)
        if entry is None or entry.get("identity") != identity:
            entry = {"identity": identity}
        if fact not in entry:
            entry[fact] = compute(file)
            self._entries[key] = entry
            self._changed = True
        return entry[fact]

    def save(self) -> None:
        """Writes the memo back if a digest was added."""
        if not self._changed:
            return
        try:
            write_text(self._path, json.dumps(self._entries, indent=1, sort_keys=True))
        except OSError as error:
            # Only a speed-up: failing to remember hashes must not fail the run.
            logger.warning("cannot update %s: %s", self._path, error)
