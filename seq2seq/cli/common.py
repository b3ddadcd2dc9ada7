"""What the Hydra entry points share: the config folder, one-line errors, CPU threads."""

from __future__ import annotations

import sys
from typing import NoReturn

from seq2seq import CONFIG_DIR as _CONFIG_PATH

# An absolute path: Hydra resolves a relative config_path against the importing module's
# package, which breaks when an app is imported (root scripts, console scripts) not run.
CONFIG_DIR = str(_CONFIG_PATH)


def first_line(error: BaseException) -> str:
    """An exception as one line: its message's first line, or its type's name."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def fail(message: str | BaseException) -> NoReturn:
    """Print ``error: MESSAGE`` (one line) on stderr and exit with status 1."""
    text = first_line(message) if isinstance(message, BaseException) else message
    print(f"error: {text}", file=sys.stderr, flush=True)
    sys.exit(1)
